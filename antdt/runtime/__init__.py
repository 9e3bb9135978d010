"""What every service process shares: starting services as children, the poll loop, signals, health
and metrics."""
