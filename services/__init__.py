"""The antdt services: monitor (detection), controller (policies), sharder (data)."""
