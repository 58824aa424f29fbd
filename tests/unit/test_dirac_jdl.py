"""JDLs as DIRAC and gLite read them, case by case.

Each expectation says where it comes from: DIRAC's ``ParametricJob`` utility
(DIRAC/WorkloadManagementSystem/Utilities/ParametricJob.py, ``generateParametricJobs`` and
``__getParameterSequence``) and its tests (``Test_ParametricJob.py``), DIRAC's light ClassAd
parser (Core/Utilities/ClassAd/ClassAdLight.py), what DIRAC's ``Job`` API writes
(Interfaces/API/Job.py, ``_toJDL``), diracx's submission tests (diracx-routers
tests/jobs/conftest.py), and the gLite WMS user guide's parametric jobs (``_PARAM_``; the range
stops before ``Parameters``). Where gridpilot differs on purpose, the test checks the warning.
"""

from __future__ import annotations

import pytest

from optimizers.description import JobDescription, JobDescriptionError
from optimizers.jdl import parse_jdl
from tests.helpers import refusal


def _args(text: str) -> list[str]:
    return [" ".join(job.arguments) for job in parse_jdl(text)]


def _warnings(text: str) -> list[str]:
    return list(parse_jdl(text)[0].warnings)


# -- ParametricJob, case by case ---------------------------------------------------------------

# Test_ParametricJob.TEST_JDL_SIMPLE: a list of values.
SIMPLE = '[ Executable = "my_executable"; Arguments = "%s"; JobName = "Test_%n"; ' \
         'Parameters = { "a", "b", "c" } ]'
# Test_ParametricJob.TEST_JDL_SIMPLE_BUNCH: no step, so every value is the start.
BUNCH = '[ Executable = "my_executable"; Arguments = "%s"; JobName = "Test_%n"; ' \
        "Parameters = 3; ParameterStart = 5; ]"
# Test_ParametricJob.TEST_JDL_SIMPLE_PROGRESSION: value = previous * factor + step.
PROGRESSION = '[ Executable = "my_executable"; Arguments = "%s"; JobName = "Test_%n"; ' \
              "Parameters = 3; ParameterStart = 1; ParameterStep = 1; ParameterFactor = 2; ]"
# Test_ParametricJob.TEST_JDL_MULTI: a named progression and a named list beside each other.
MULTI = '''[
    Executable = "my_executable";
    Arguments = "%(A)s %(B)s";
    JobName = "Test_%n";
    Parameters = 3;
    ParameterStart.A = 1;
    ParameterStep.A = 1;
    ParameterFactor.A = 2;
    Parameters.B = { "a","b","c" };
]'''


@pytest.mark.parametrize(("jdl", "arguments"), [
    (SIMPLE, ["a", "b", "c"]),
    (BUNCH, ["5", "5", "5"]),
    (PROGRESSION, ["1", "3", "7"]),
    (MULTI, ["1 a", "3 b", "7 c"]),
], ids=["simple", "bunch", "progression", "multi"])
def test_dirac_parametric_tests(jdl: str, arguments: list[str]) -> None:
    jobs = parse_jdl(jdl)
    assert [" ".join(j.arguments) for j in jobs] == arguments
    assert [j.job_name for j in jobs] == ["Test_0", "Test_1", "Test_2"]


def test_dirac_multi_bad_lengths_are_refused() -> None:
    # Test_ParametricJob.TEST_JDL_MULTI_BAD: getParameterVectorLength fails.
    error = refusal(parse_jdl, MULTI.replace('{ "a","b","c" }', '{ "a","b","c","d" }'))
    assert error.field == "Parameters.B"
    assert "4 values" in str(error) and "3 jobs" in str(error)


def test_parameters_alone_start_at_one_with_step_zero() -> None:
    # generateParametricJobs: parStart=.get("ParameterStart", 1), parStep=.get(..., 0).
    assert _args('Executable = "a"; Arguments = "%s"; Parameters = 3;') == ["1", "1", "1"]
    assert "no ParameterStep" in _warnings('Executable = "a"; Arguments = "%s"; Parameters = 3;')[0]


def test_no_step_warning_only_where_the_value_is_used() -> None:
    # Three copies of a job that never reads its parameter: nothing to warn about.
    assert _warnings('Executable = "a"; Parameters = 3;') == []


def test_a_float_step_makes_float_values_written_as_python_writes_them() -> None:
    # __getParameterSequence: parStart * type(parFactor)(1) + type(parStep)(0), then str().
    assert _args('Executable = "a"; Arguments = "%s"; Parameters = 3; ParameterStart = 1; '
                 "ParameterStep = 0.5;") == ["1.0", "1.5", "2.0"]


def test_float_noise_is_rounded_with_a_warning() -> None:
    text = ('Executable = "a"; Arguments = "%s"; Parameters = 3; ParameterStart = 0.1; '
            "ParameterStep = 0.1;")
    assert _args(text) == ["0.1", "0.2", "0.3"]
    # DIRAC's recurrence gives 0.1 + 0.1 + 0.1 = 0.30000000000000004.
    assert any("0.30000000000000004" in w for w in _warnings(text))


def test_index_is_zero_padded_to_the_width_of_the_last_index() -> None:
    # generateParametricJobs: str(n).zfill(len(str(nParValues - 1))).
    jobs = parse_jdl('Executable = "a"; JobName = "run_%n"; Parameters = 11; ParameterStep = 1;')
    assert [j.job_name for j in jobs][:2] == ["run_00", "run_01"]
    assert jobs[-1].job_name == "run_10"


def test_placeholders_are_replaced_in_every_attribute() -> None:
    # __updateAttribute runs over every attribute of the ad, not only a few.
    jobs = parse_jdl('Executable = "a"; Parameters = {"LCG.CERN.cern", "LCG.CNAF.it"}; '
                     'Site = "%s"; JobGroup = "g_%s"; MyTag = "t_%s";')
    assert [sorted(j.sites) for j in jobs] == [["LCG.CERN.cern"], ["LCG.CNAF.it"]]
    assert [j.job_group for j in jobs] == ["g_LCG.CERN.cern", "g_LCG.CNAF.it"]
    assert [j.extra["MyTag"] for j in jobs] == ["t_LCG.CERN.cern", "t_LCG.CNAF.it"]


def test_a_named_sequence_needs_parameters() -> None:
    # generateParametricJobs returns the JDL unexpanded without "Parameters" (one job with
    # %(B)s left in it): gridpilot refuses it with the remedy instead.
    error = refusal(parse_jdl, 'Executable = "a"; Arguments = "%(B)s"; Parameters.B = {1, 2};')
    assert "only meaningful with Parameters" in str(error)


def test_a_named_sequence_is_a_list_or_a_progression() -> None:
    # generateParametricJobs: a non-list Parameters.X is "Inconsistent parametric job
    # description".
    refusal(parse_jdl, 'Executable = "a"; Parameters = 2; Parameters.A = 2;')


def test_diracx_parametric_jdl_with_list_parameters() -> None:
    # diracx-routers tests/jobs/conftest.py TEST_PARAMETRIC_JDL: unquoted %(X)s, a list of
    # lists as a sequence (each job's InputData is one list).
    text = '''Executable = "dirac-jobexec";
    Arguments = "-p JOB_ID=%(JOB_ID)s -p InputData=%(InputData)s";
    InputData = %(InputData)s;
    Parameters = 2;
    Parameters.InputData = {{/lhcb/d1, /lhcb/d2}, {/lhcb/d3, /lhcb/d4}};
    Parameters.JOB_ID = {1, 2};'''
    jobs = parse_jdl(text)
    assert [j.input_data for j in jobs] == [("/lhcb/d1", "/lhcb/d2"), ("/lhcb/d3", "/lhcb/d4")]
    assert jobs[1].arguments == ("-p", "JOB_ID=2", "-p", "InputData={/lhcb/d3,/lhcb/d4}")


def test_a_list_parameter_is_spliced_into_a_list() -> None:
    # __updateAttribute: in a list attribute the parameter's braces are dropped.
    jobs = parse_jdl('Executable = "a"; InputSandbox = {"common.py", "%(F)s"}; Parameters = 2; '
                     'Parameters.F = {{"x1", "x2"}, {"y1"}};')
    assert [j.input_sandbox for j in jobs] == [("common.py", "x1", "x2"), ("common.py", "y1")]


def test_spaces_in_listed_values_are_kept_with_a_warning() -> None:
    # getListFromExpression removes every space of a list; gridpilot keeps them.
    text = 'Executable = "a"; Arguments = "%s"; Parameters = {"run 1", "run 2"};'
    assert _args(text) == ["run 1", "run 2"]
    assert any("keeps its spaces" in w for w in _warnings(text))


def test_not_parametric_leaves_placeholders_alone() -> None:
    # generateParametricJobs returns early when there is no "Parameters".
    (job,) = parse_jdl('Executable = "a"; Arguments = "%s %n";')
    assert job.arguments == ("%s", "%n")


# -- gLite parametric jobs ---------------------------------------------------------------------


def test_glite_range_stops_before_parameters() -> None:
    # gLite WMS user guide: Parameters = 6; ParameterStep = 2; ParameterStart = 0 makes
    # message0.sh, message2.sh, message4.sh ("the last value of Parameters being excluded").
    jobs = parse_jdl('[ JobType = "Parametric"; Executable = "/bin/sh"; '
                     'Arguments = "message_PARAM_.sh"; Parameters = 6; ParameterStep = 2; '
                     'ParameterStart = 0; StdOutput = "std_PARAM_.out"; ]')
    assert [j.arguments for j in jobs] == [("message0.sh",), ("message2.sh",), ("message4.sh",)]
    assert [j.stdout for j in jobs] == ["std0.out", "std2.out", "std4.out"]
    assert {j.job_type for j in jobs} == {"User"}  # a gLite kind, not a job type
    assert any("DIRAC would make 6" in w for w in jobs[0].warnings)


def test_glite_defaults_start_zero_step_one() -> None:
    jobs = parse_jdl('[ JobType = "Parametric"; Executable = "a"; Arguments = "_PARAM_"; '
                     "Parameters = 3; ]")
    assert [j.arguments for j in jobs] == [("0",), ("1",), ("2",)]
    assert not any("DIRAC would make" in w for w in jobs[0].warnings)  # 3 jobs either way


def test_glite_normal_is_a_kind_not_a_job_type() -> None:
    (job,) = parse_jdl('[ JobType = "Normal"; Executable = "a"; ]')
    assert job.job_type == "User"
    assert any('"Normal" is gLite\'s kind of job' in w for w in job.warnings)


def test_param_placeholder_without_glite_job_type_is_replaced_with_a_warning() -> None:
    jobs = parse_jdl('Executable = "a"; Arguments = "_PARAM_"; Parameters = {"x", "y"};')
    assert [j.arguments for j in jobs] == [("x",), ("y",)]
    assert any("_PARAM_" in w for w in jobs[0].warnings)


# -- bare words and comments -------------------------------------------------------------------


def test_bare_words_as_the_job_api_writes_them() -> None:
    # Job._toJDL: insertAttributeInt writes a string value without quotes; diracx submits that.
    (job,) = parse_jdl("JobName = jobName; JobGroup = jobGroup; JobType = User; Site = ANY; "
                       'Executable = "dirac-jobexec"; StdOutput = std.out; LogLevel = INFO; '
                       "OutputSandbox = {Script1_CodeOutput.log, std.err, std.out};")
    assert (job.job_name, job.job_group, job.job_type, job.stdout) == (
        "jobName", "jobGroup", "User", "std.out")
    assert job.sites == frozenset()
    assert job.output_sandbox == ("Script1_CodeOutput.log", "std.err", "std.out")
    assert job.extra == {"LogLevel": "INFO"}


def test_bare_words_do_not_change_classad_meanings() -> None:
    (job,) = parse_jdl('Executable = "a"; CPUTime = 3 * 3600; MaxRAM = 4096; Interactive = '
                       "false; Priority = 7200/1200;")
    assert (job.cpu_time, job.memory, job.priority) == (10800, 4096, 6)
    assert job.extra == {"Interactive": False}


def test_requirements_keep_classad_semantics() -> None:
    (job,) = parse_jdl('Executable = "a"; Requirements = other.MaxRAM >= 2000;')
    assert job.requirements_expression == "other.MaxRAM >= 2000"
    # A bare word inside a Requirements section is still an undefined reference.
    assert "not defined" in str(refusal(
        parse_jdl, 'Executable = "a"; Requirements = [ SoftwareTag = VO_lhcb_ROOT; ];'))


def test_hash_comments_outside_strings_only() -> None:
    (job,) = parse_jdl('[\n  # a whole-line comment\n  Executable = "run#1.sh"; # after\n'
                       '  Arguments = "a # b";\n]\n# after the ad\n')
    assert job.executable == "run#1.sh"
    assert job.arguments == ("a", "#", "b")


def test_hostile_bare_words_stay_text() -> None:
    # Characters the ClassAd library would read as operators stay part of the text.
    (job,) = parse_jdl("Executable = /usr/bin/env; Arguments = \"-i\"; JobName = a-b+c*d;")
    assert (job.executable, job.job_name) == ("/usr/bin/env", "a-b+c*d")
    # A quote, a bracket or a call is not a bare word: ClassAd reads it, and refuses it.
    refusal(parse_jdl, 'Executable = a"b;')
    refusal(parse_jdl, "Executable = strcat(a, b);")


def test_dotted_names_that_are_not_sequences_are_kept_as_extra() -> None:
    (job,) = parse_jdl('Executable = "a"; Foo.Bar = 1;')
    assert job.extra == {"Foo.Bar": 1}


def test_executable_alone_empty_is_still_refused() -> None:
    with pytest.raises(JobDescriptionError, match="Executable must be a non-empty string"):
        parse_jdl('Executable = "";')


def test_percent_j_is_the_job_id_in_what_the_payload_runs() -> None:
    (job,) = parse_jdl('Executable = "a"; StdOutput = "StdOut_%j"; JobName = "n_%j"; '
                       'OutputSandbox = {"StdOut_%j"};')
    ran: JobDescription = job.for_job(42)
    assert (ran.stdout, ran.job_name, ran.output_sandbox) == ("StdOut_42", "n_42",
                                                              ("StdOut_42",))
    assert job.stdout == "StdOut_%j"  # the stored description keeps it
