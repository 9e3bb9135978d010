"""Authority over the services at run time: the control-config topic and the signatures on
commands."""
