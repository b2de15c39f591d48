"""Two stored results of a study compared on the same samples: their per-sample metric terms read back from the
store, and their paired difference (`uncertainty.paired_difference`) from one accuracy source both were scored
on."""

from __future__ import annotations

from ..errors import MpstudioError
from ..metric_terms import MetricTerms
from ..sources import superseded_source
from ..store import StudyStore
from .uncertainty import PairedDifference, paired_difference


def stored_terms(store: StudyStore, plan_id: int | None, accuracy_source: str) -> MetricTerms | None:
    """The per-sample metric terms of a plan's result from `accuracy_source`; None when it has none (a metric of
    the whole set, a result stored before terms were kept, no result)."""
    row = store.sample_terms(int(plan_id), accuracy_source) if plan_id is not None else None
    return MetricTerms.read(*row) if row is not None else None


def named_terms(store: StudyStore, plan_id: int | None, accuracy_source: str) -> tuple[str, MetricTerms] | None:
    """(the plan's name, its terms from `accuracy_source`), or None when it has none."""
    terms = stored_terms(store, plan_id, accuracy_source)
    return (store.plan_row(plan_id)[1], terms) if terms is not None else None


def compare_stored(store: StudyStore, plan_id: int | None, versus_id: int | None, metric: str,
                   higher_is_better: bool, accuracy_source: str | None = None) -> PairedDifference:
    """Plan `plan_id` minus plan `versus_id` on the same samples, from the first accuracy source (or
    `accuracy_source`) both have per-sample terms from."""
    if plan_id is None or versus_id is None:
        raise MpstudioError("compare two plans the study has evaluated (one of them is not in the study)")
    found = paired_from_store(store, plan_id, versus_id, metric, higher_is_better, accuracy_source)
    if found is None:
        raise MpstudioError(f"plans {plan_id} and {versus_id} have no results with per-sample terms from one "
                            f"accuracy source{' ' + repr(accuracy_source) if accuracy_source else ''}; evaluate both "
                            "there (results stored by an older mpstudio, or of a metric of the whole set, have none)")
    return found[1]


def paired_from_store(store: StudyStore, plan_id: int, versus_id: int, metric: str, higher_is_better: bool,
                      accuracy_source: str | None = None) -> tuple[str, PairedDifference] | None:
    """(the accuracy source, plan `plan_id` minus plan `versus_id` there) from the first source (or
    `accuracy_source`) both have per-sample terms from on the same units, a superseded one (`sources`) only when no
    other has them; None when there is none."""
    frame = store.evaluations()
    if not len(frame):
        return None
    sources = [s for s in dict.fromkeys(frame["accuracy_source"])
               if all(((frame["plan_id"] == i) & (frame["accuracy_source"] == s)).any() for i in (plan_id, versus_id))]
    sources.sort(key=superseded_source)  # an earlier mpstudio's CPU numerics last (a stable sort)
    for source in [s for s in sources if accuracy_source in (None, s)]:
        a, b = stored_terms(store, plan_id, source), stored_terms(store, versus_id, source)
        if a is not None and b is not None and a.units == b.units:
            return source, paired_difference(a, b, metric=metric, higher_is_better=higher_is_better,
                                             plan_name=store.plan_row(plan_id)[1],
                                             versus_name=store.plan_row(versus_id)[1])
    return None


__all__ = ["stored_terms", "named_terms", "compare_stored", "paired_from_store"]
