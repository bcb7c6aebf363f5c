"""The experiments the teaching views run, written as jobs (engine.serving.jobs).

Owns traces of whole runs and fault comparisons (`traces`), measurements (the verification cost curve, the
distribution check; `measure`), the speed-up formulas and the accelerator roofline (`theory`), a race of
two settings (`race`) and the shoot-out of drafting methods (`shootout`).

May import: every other room of engine/ (engine.training excepted).
"""
