"""The one place for Kafka plumbing: clients, topics, readers, markers, dead letters, Faust."""
