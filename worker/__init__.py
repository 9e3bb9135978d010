"""The agent a training script embeds: metrics, data shards, commands (issue 4)."""
