"""`decoding-playground bench ...`: one module per bench command, each writing its section of
docs/benchmarks.md (`engine`, `page`, `smollm2`, `heads`, `serve`, `engines`, `faults`, `views`), and what they share:
a real server started for a bench (`served`), the speculative sweep (`spec`), SmolLM2's step breakdown
(`smollm2_profile`) and the serve and views benches' tables (`serve_report`, `views_report`)."""
