"""Attributes of DIRAC's and gLite's JDLs that gridpilot knows but does not use as they do.

Each is kept with the job's other fields (the payload sees it) and earns the submitter a
warning that says what gridpilot does with it, rather than "unknown attribute".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Lower-case name → what gridpilot does with the attribute.
FOREIGN = {
    "virtualorganisation": "checked: a job belongs to the VO of the token that submits it, "
                           "and one that names another VO is refused",
    "virtualorganization": "checked: a job belongs to the VO of the token that submits it, "
                           "and one that names another VO is refused",
    "owner": "not used: a job belongs to the subject of the token that submits it",
    "ownergroup": "not used: a job belongs to the group of the token that submits it",
    "retrycount": "not used: a job whose pilot is lost is rescheduled up to the service's "
                  "[taskqueue] max_reschedules times; one that fails is not retried",
    "shallowretrycount": "not used: a job whose pilot is lost is rescheduled up to the "
                         "service's [taskqueue] max_reschedules times",
    "rank": "not used: pilots pull the jobs their queue can run; Rank does not order queues",
    "outputse": "not used: gridpilot does not store output data; the job stores it itself",
    "outputdata": "not used: gridpilot does not store output data; the job stores it itself",
    "outputpath": "not used: gridpilot does not store output data; the job stores it itself",
    "myproxyserver": "not used: gridpilot's jobs and pilots use tokens, not proxies renewed "
                     "from MyProxy",
    "inputdatapolicy": "not used: gridpilot does not download input data; the job reads its "
                       "files itself (InputData decides where it runs)",
    "inputdatamodule": "not used: gridpilot does not download input data; the job reads its "
                       "files itself (InputData decides where it runs)",
    "type": 'not used: gLite\'s Type = "Job" (gridpilot knows only jobs)',
    "origin": "not used: DIRAC's record of the submitting tool",
    "loglevel": "passed to the job as it is (DIRAC's job wrapper reads it; gridpilot's pilot "
                "does not)",
}


def foreign_notes(extra: Iterable[str]) -> list[str]:
    """A warning for each attribute of ``extra`` that :data:`FOREIGN` knows, by name."""
    return [f"{name}: {FOREIGN[name.lower()]}"
            for name in sorted(extra, key=str.lower) if name.lower() in FOREIGN]


#: gLite's attribute naming a job's VO, in both spellings (lower case).
VO_ATTRIBUTES = frozenset({"virtualorganisation", "virtualorganization"})


def vo_mismatch(extra: Mapping[str, object], vo: str) -> str | None:
    """Why the VO a job names for itself contradicts ``vo``, its submitter's; None when it
    names none or the same."""
    for name, value in extra.items():
        if name.lower() not in VO_ATTRIBUTES:
            continue
        if isinstance(value, str) and value.strip() == vo:
            continue
        return (f"{name} = {value!r} names another VO than the submitter's token ({vo!r}): a "
                f"job belongs to its submitter's VO; leave {name} out, or submit with a "
                "token of that VO")
    return None
