"""JDL reading benchmark: milliseconds to read a description into its jobs, per form.

The forms: a plain DIRAC user job, the same as DIRAC's Job API writes it (bare words, no
brackets), a gLite job with # comments, a parametric list of 1,000 values with six templated
fields, a numeric range of 10,000 jobs. Each is read ``--repeat`` times and the best time is
kept; a fixed pure-Python loop measured in the same run calibrates the machine (compare runs by
the ratio). One JSON line on stdout. Run from the repository root::

    .venv/bin/python bench/jdl.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

from optimizers.jdl import parse_jdl

FORMS = {
    "dirac_user_job": '''[
        JobName = "fit"; Executable = "dirac-jobexec"; Arguments = "job.xml -o LogLevel=INFO";
        InputSandbox = {"job.xml", "run.py"}; OutputSandbox = {"std.out", "std.err"};
        StdOutput = "std.out"; StdError = "std.err"; CPUTime = 172800; Priority = 5;
        Site = {"LCG.CERN.cern", "LCG.CNAF.it"}; Platform = "x86_64-el9"; MaxRAM = 4000;
    ]''',
    "dirac_job_api_bare_words": '''
        Arguments = "jobDescription.xml -o LogLevel=INFO"; Executable = "dirac-jobexec";
        InputSandbox = {jobDescription.xml, /home/u/run.py}; JobGroup = fits; JobName = fit;
        JobType = User; LogLevel = INFO; OutputSandbox = {std.err, std.out}; Priority = 1;
        Site = ANY; StdError = std.err; StdOutput = std.out;''',
    "glite_with_comments": '''# a gLite job
    [
      Executable = "/bin/hostname";   # the program
      StdOutput = "std.out"; StdError = "std.err"; OutputSandbox = {"std.out", "std.err"};
      Requirements = other.MaxRAM >= 2000   # enough memory
                     && other.CPUTime > 3600;
    ]''',
    "parametric_list_1000": (
        'Executable = "gen.sh"; Arguments = "--seed %s --out out_%n.root"; '
        'StdOutput = "o_%n.txt"; StdError = "e_%n.txt"; OutputSandbox = {"o_%n.txt", '
        '"e_%n.txt"}; JobName = "j_%n"; Parameters = {'
        + ",".join(f'"v{i}"' for i in range(1000)) + "};"),
    "parametric_range_10000": ('Executable = "/bin/echo"; Arguments = "run %n"; '
                               "Parameters = 10000; ParameterStep = 1;"),
}


def best_ms(work: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def calibration_s() -> float:
    """Seconds a fixed pure-Python loop takes on this machine now."""
    started = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i * i
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="reads per large form")
    args = parser.parse_args()
    out: dict[str, float] = {"calibration_s": round(calibration_s(), 4),
                             "load_1min": os.getloadavg()[0]}
    for name, text in FORMS.items():
        repeat = args.repeat if name.startswith("parametric") else args.repeat * 40
        try:
            out[f"{name}_ms"] = round(best_ms(lambda t=text: parse_jdl(t), repeat), 3)
        except Exception as exc:  # an older reader that refuses a form: say so, go on
            print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    out["calibration_after_s"] = round(calibration_s(), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
