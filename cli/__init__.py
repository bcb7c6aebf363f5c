"""The `decoding-playground` command: serve, bench, train, models, generate."""
