"""`decoding-playground bench ...`: one module per bench command, each writing its section of
docs/benchmarks.md (`engine`, `page`, `smollm2`, `heads`, `serve`, `engines`, `faults`), and what they share:
a real server started for a bench (`served`), the speculative sweep (`spec`), SmolLM2's step breakdown
(`smollm2_profile`) and the serve bench's tables (`serve_report`)."""
