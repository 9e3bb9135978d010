"""The embedded Kafka-compatible broker (Tansu) the demo, development and tests run on, and its
SCRAM front."""
