"""Automatic mixed-precision search: the fewest 16-bit tensors that reach a target accuracy.

The walk, from the sensitivity ranking:
1. Evaluate the baselines (a8w8, a16w8); the target may be relative to them ("a16w8+10%").
2. Weights first: when the weight scores show that per-channel int8 weights quantize much better than
   per-tensor uint8 (free on HTP), the per-channel base is evaluated and kept if it is better.
3. Order the activation tensors by predicted gain (the noise power their isolated promotion removes from
   the base plan, in a sensitivity analysis of that plan) per unit of estimated latency cost (`latency.promotion_costs`). Plan k promotes the first k of that order.
4. Find the smallest k that reaches the target: a first guess from the isolation prediction, then
   bisection; with several agents, several k per round (multi-section). A latency budget caps k (from
   the cost model, which needs no evaluation); an evaluation budget caps the rounds.
5. Confirm on the HTP (by default, when the walk ran on the CPU reference): the recommended plan and its
   neighbours on the front of the walk's evaluations are evaluated on the HTP (the local emulator, or the
   device behind the runner), cheaper ones while the HTP still reaches the target, dearer ones until it
   does. The recommendation follows the HTP's numbers; where CPU and HTP disagree (one reaches the target
   and the other not, or they order two plans differently) the result says so.
Every evaluation lands in the study as it finishes, and a search is recorded by its spec: rerunning an
interrupted search replays it against the stored results and continues where it stopped.

Its rooms: `targets` (what to reach, the baselines a target may name), `order` (the promotion order and the
mixed weight order, the plans a prefix makes), `walk` (the walk and its recommendation), `recommend` (the
closest plan, much better for little more), `confirmation` (the HTP confirmation), `result` (what a search found,
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

__all__ = ["search", "resume", "resume_searches", "Target", "SearchResult", "Confirmation", "disagreements", "meets",
           "path_frame", "closest_plan", "better_for_little_more", "named_baselines", "target_plan", "LineProgress",
           "LITTLE_MORE", "MUCH_BETTER", "apply_steps", "mixed_base", "mixed_order", "promotion_order",
           "cached_weight_isolation", "confirm", "estimate_ms", "Walk", "WEIGHT_MODES", "CONFIRM_BACKENDS",
           "CONFIRM_PLANS", "PER_CHANNEL_GAIN_DB"]
