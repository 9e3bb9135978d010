"""Sharder: stateful dynamic data sharding with an event-sourced log (issue 3)."""
