"""`decoding-playground bench ...`: one module per bench command, each writing its section of docs/benchmarks.md
(`engine`, `smollm2`, `heads`, `page`, `serve`, `engines`, `faults`, `views`) on one harness (`lib`: runs taken in
turns, paired speed-ups, the machine line, tables, sections), and what they share: speculative runs and their figures
(`spec`), a real server (`served`) and its /api/ws clients (`serve_clients`), the page in Chromium (`browser`), and
the parts of some benches (`heads_runs`, `heads_vllm`, `smollm2_profile`, `serve_vllm`, `vllm_engines`, `hf_worker`).
"""
