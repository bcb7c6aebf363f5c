"""The seeded sampling check both rejection-sampler tests use: draw from q, verify against p (engine.spec_decode.verify),
and compare the emitted tokens' distribution with p and with direct samples from p."""
import numpy as np

from engine.spec_decode.sampling import sample
from engine.spec_decode.verify import verify


def rejection_check(p, q, n: int = 200_000, seed: int = 42) -> tuple[float, float, float]:
    """(TVD of the verified samples from p, TVD of n direct samples from p, acceptance rate), one seed."""
    rng = np.random.default_rng(seed)
    counts, accepted = np.zeros(len(p)), 0
    p2 = np.stack([p, p])
    for _ in range(n):
        x = sample(q, rng)
        verdicts, _ = verify([x], q[None], p2, rng)
        counts[verdicts[0].token_id if verdicts[0].status == "accepted" else verdicts[1].token_id] += 1
        accepted += verdicts[0].status == "accepted"
    direct = np.bincount([sample(p, rng) for _ in range(n)], minlength=len(p)) / n
    return 0.5 * np.abs(counts / n - p).sum(), 0.5 * np.abs(direct - p).sum(), accepted / n
