"""Automatic mixed-precision search: the fewest 16-bit tensors that reach a target accuracy.

The walk:
1. Cheap checks first: the baselines (a8w8, a16w8, and both per-channel forms a8w8-pc, a16w8-pc whenever
   per-channel int8 weights are in play: they cost nothing on HTP latency) and the target. When an all-8-bit
   baseline reaches the target, nothing is cheaper: no sensitivity analysis runs.
2. Weights (`weights`): `--weights auto` keeps per-tensor weights when the weight scores show no gain, else
   measures both forms and starts from the better; it says why.
3. Order the activation tensors by the noise their promotion surely removes (a lower bound over the isolation
   samples) per unit of estimated latency cost (`order`); tensors a progressive analysis did not isolate
   follow, by their cheap scores. Plan k promotes the first k.
4. Walk k without assuming accuracy rises with it (`grid`): a coarse geometric grid, then refinement below the
   smallest k that reaches the target, else around the best values, while the evaluation budget allows. A plan
   whose estimated latency is at or above (or within the cost model's resolution of) a stored plan's that
   reaches the target, or that is as good as the best all-16-bit plan, is never evaluated.
4b. Then walk top-down (`topdown`) with the share of the evaluations the first walk left: from the all-16-bit
   plan, demote the tensors whose 8 bits add the least noise (measured against the all-16-bit plan where the
   analysis isolated them, else their own quantization noise) per ms saved, and take the cheapest prefix that
   still reaches the target. Where the error is the sum of many small contributions, or comes from tensors
   that only help together, single promotions from the all-8-bit plan show nothing while single demotions
   still price every tensor.
5. Confirm on the HTP (by default, when the walk ran on the CPU reference): the pick and its neighbours on
   the front are evaluated on the HTP; where CPU and HTP disagree the result says so. When the HTP reads the
   walk's pick short of the target, the walk goes on against the target tightened by that gap (`rewalk`),
   and the HTP confirms what it finds.
6. Recommend over every plan the study holds for the confirming backend (else the walk's), not only the walk's
   path (`choice`): the cheapest that reaches the target, else the most accurate within the latency budget,
   never a plan another stored plan dominates; the result lists the plans considered and why the pick.
   Estimated latencies closer than the cost model resolves (`latency.resolution`: 1 % of the dearer, at least
   one op's fixed cost) are a tie, and a tie goes to the better value, in the pick and in the pruning alike.
Every evaluation lands in the study as it finishes, and a search is recorded by its spec: rerunning an
interrupted search replays it against the stored results and continues where it stopped.

Its rooms: `targets` (what to reach, the baselines a target may name), `order` (the promotion order and the
mixed weight order, the plans a prefix makes), `walk` (the walk and its recommendation), `grid` (the walk over k),
`topdown` (the top-down walk's order and first points), `recommend` (the
closest plan, much better for little more), `confirmation` (the HTP confirmation), `rewalk` (the walk going on
past a pick the HTP reads short), `result` (what a search found,
in words and JSON), `run` (the entry point, `search`) and `resuming` (killed searches continued).
"""

from .confirmation import confirm
from .order import apply_steps, cached_weight_isolation, mixed_base, mixed_order, promotion_order
from .recommend import LITTLE_MORE, MUCH_BETTER, better_for_little_more, closest_plan, estimate_ms
from .result import Confirmation, SearchResult, disagreements, path_frame
from .resuming import resume, resume_searches
from .run import CONFIRM_BACKENDS, CONFIRM_PLANS, WEIGHT_MODES, LineProgress, search
from .targets import Target, meets, named_baselines, target_plan
from .walk import PER_CHANNEL_GAIN_DB, Walk
from .choice import Choice, Considered, choose, dominates

__all__ = ["search", "resume", "resume_searches", "Target", "SearchResult", "Confirmation", "disagreements", "meets",
           "path_frame", "closest_plan", "better_for_little_more", "named_baselines", "target_plan", "LineProgress",
           "LITTLE_MORE", "MUCH_BETTER", "apply_steps", "mixed_base", "mixed_order", "promotion_order",
           "cached_weight_isolation", "confirm", "estimate_ms", "Walk", "WEIGHT_MODES", "CONFIRM_BACKENDS",
           "CONFIRM_PLANS", "PER_CHANNEL_GAIN_DB", "Choice", "Considered", "choose", "dominates"]
