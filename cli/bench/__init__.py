"""`decoding-playground bench ...`: one module per bench command, each writing its section of
docs/benchmarks.md (`engine`, `page`, `smollm2`, `heads`, `serve`, `engines`, `faults`, `views`), their parts
(`*_threads` at 1 and N threads, `*_vllm` against a real vLLM), and what they share: a real server started for a
bench (`served`) and its /api/ws clients (`serve_clients`), the page in Chromium (`browser`), the speculative sweep
(`spec`), `bench heads`' runs (`heads_runs`), SmolLM2's step breakdown (`smollm2_profile`) and the serve bench's
tables (`serve_report`)."""
