"""Training in numpy with handwritten backprop: ops (forward/backward pairs), the Llama model built from
them, the stdlib corpus, a flat training loop and the `train` command; the draft heads' data, training and
offline evaluation, and the `train-heads` command.

May import: engine.model, engine.kv, engine.spec_decode, engine.serving. Its command line imports lazily.
"""
