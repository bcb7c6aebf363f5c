"""`decoding-playground bench ...`: a module per bench command, each writing its section of docs/benchmarks.md
through one harness (lib.py), and the parts they share."""
