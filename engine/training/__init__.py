"""Training in numpy with handwritten backprop: ops (forward/backward pairs), the Llama model built from
them, the stdlib corpus, a flat training loop and the `train` command."""
