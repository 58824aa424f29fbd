"""The resources configuration: loading, inheritance, RFC 7 eligibility and its explanations."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from optimizers.resources import (
    ResourcesConfig,
    conflicting_requirements,
    eligible_queues,
    explain_requirements,
    get_eligible_nodes,
    load_resources,
    no_match_reason,
    parse_resources,
    serves_vo,
    unmet_requirements,
)
from taskqueue.core.errors import ConfigurationError, InvalidRequirementsError, NotFoundError

# A small grid. Site A serves lhcb and belle; site B serves only lhcb; site C states no VO (open
# to all). The values are chosen so that every level overrides something.
GRID = """
[JobDescription]
Platform = "list"
Tags = "list"
SoftwareTag = "list"
VO = "list"
CPUModel = "string"
Where = "string"

[Sites.A]
VO = ["lhcb", "belle"]
HS06 = 10.0
Platform = "x86_64-el9"
Where = "site"
MaxRAM = 1000

[Sites.A.VOs.lhcb]
Where = "site-lhcb"
SoftwareTag = ["gauss-v50", "davinci-v46"]

[Sites.A.CEs.ce1]
Where = "ce"
CPUModel = "Xeon"

[Sites.A.CEs.ce1.VOs.lhcb]
Where = "ce-lhcb"

[Sites.A.CEs.ce1.Queues.long]
MaxCPUTime = 2880
NumberOfProcessors = 1
MaxRAM = 2000
Where = "queue"

[Sites.A.CEs.ce1.Queues.long.VOs.lhcb]
Where = "queue-lhcb"

[Sites.A.CEs.ce1.Queues.mcore]
MaxCPUTime = 1440
NumberOfProcessors = 8
MaxRAM = 16000
Tags = ["MultiProcessor"]

[Sites.A.CEs.ce2]
Platform = ["aarch64-el9"]
SI00 = 3000

[Sites.A.CEs.ce2.Queues.arm]
MaxCPUTime = 60
NumberOfProcessors = 4
MaxRAM = 8000
Tags = "GPU"

[Sites.B]
VO = "lhcb"
SI00 = 2500
Platform = ["x86_64-el9", "x86_64-el8"]

[Sites.B.CEs.ce3.Queues.short]
MaxCPUTime = 30
MaxRAM = 4000

[Sites.B.CEs.ce3.Queues.short.VOs.lhcb]
Tags = ["lhcb-only"]

[Sites.B.CEs.empty]

[Sites.C]
Diskless = 1
Flavour = ["vanilla", "chocolate"]

[Sites.C.CEs.ce4.Queues.q]
cpumodel = "Epyc"
"""

ORIGIN = "grid.toml"


@pytest.fixture()
def grid() -> ResourcesConfig:
    return parse_resources(GRID, ORIGIN)


def queues(config: ResourcesConfig, requirements: dict[str, Any], vo: str | None = None
           ) -> list[str]:
    return [f"{s}/{c}/{q}" for s, c, q in eligible_queues(config, requirements, vo=vo)]


# --- the shipped file -------------------------------------------------------------------------


def test_the_shipped_file_loads(repo_root: Path) -> None:
    config = load_resources(repo_root / "conf" / "resources.toml")
    assert list(config.sites) == ["LCG.CERN.cern", "LCG.CNAF.it", "LCG.RAL.uk",
                                  "DIRAC.Demo.local"]
    demo = config.queue("DIRAC.Demo.local", "localhost", "local")
    assert demo.parameter("Executor") == "local"
    assert demo.normalised_cpu_time("lhcb") == 3600
    assert config.job_description_types["Tags"] == "list"
    assert queues(config, {"Tags": "GPU"}, "lhcb") == ["LCG.RAL.uk/arc-ce01.gridpp.rl.ac.uk/gpu"]
    assert queues(config, {"Platform": "aarch64-el9"}, "lhcb") == [
        "LCG.CERN.cern/ce-arm01.cern.ch/arm64"]
    # the ARM CE serves lhcb only
    assert queues(config, {"Platform": "aarch64-el9"}, "belle") == []
    assert queues(config, {"NumberOfProcessors": 8}, "lhcb") == [
        "LCG.CNAF.it/ce01-htc.cr.cnaf.infn.it/htc_mcore"]
    # CNAF states SI00 2500 (10 HS06); lhcb's VO section lengthens the htc queue to 3 days
    htc = config.queue("LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc")
    assert htc.normalised_cpu_time("lhcb") == 4320 * 60 * 10
    assert htc.normalised_cpu_time("belle") == 2880 * 60 * 10


# --- inheritance --------------------------------------------------------------------------------


@pytest.mark.parametrize(("site", "ce", "queue", "vo", "where"), [
    ("A", "ce1", "long", None, "queue"),       # queue overrides CE overrides site
    ("A", "ce1", "long", "lhcb", "queue-lhcb"),  # the queue's VO section wins last
    ("A", "ce1", "long", "belle", "queue"),    # no belle section anywhere
    ("A", "ce1", "mcore", None, "ce"),         # from the CE
    ("A", "ce1", "mcore", "lhcb", "ce-lhcb"),  # the CE's VO section over the CE
    ("A", "ce2", "arm", None, "site"),         # from the site
    ("A", "ce2", "arm", "lhcb", "site-lhcb"),  # the site's VO section over the site
])
def test_each_level_inherits_and_overrides(grid: ResourcesConfig, site: str, ce: str,
                                           queue: str, vo: str | None, where: str) -> None:
    assert grid.queue(site, ce, queue).parameters(vo)["Where"] == where


def test_a_plain_ce_value_overrides_the_sites_vo_section() -> None:
    config = parse_resources("""
[Sites.S]
X = "site"
[Sites.S.VOs.v]
X = "site-v"
[Sites.S.CEs.c]
X = "ce"
[Sites.S.CEs.c.Queues.q]
""", ORIGIN)
    assert config.queue("S", "c", "q").parameter("X", "v") == "ce"


def test_inherited_parameters_of_a_queue(grid: ResourcesConfig) -> None:
    assert dict(grid.queue("A", "ce1", "long").parameters("lhcb")) == {
        "VO": ("lhcb", "belle"), "HS06": 10.0, "Platform": ("x86_64-el9",),
        "Where": "queue-lhcb", "MaxRAM": 2000, "SoftwareTag": ("gauss-v50", "davinci-v46"),
        "CPUModel": "Xeon", "MaxCPUTime": 2880, "NumberOfProcessors": 1,
    }


def test_sites_and_ces_expose_their_own_inherited_parameters(grid: ResourcesConfig) -> None:
    site = grid.sites["A"]
    assert site.parameters()["Where"] == "site"
    assert site.ces["ce1"].parameters("lhcb")["Where"] == "ce-lhcb"
    assert "MaxCPUTime" not in site.ces["ce1"].parameters()
    assert [q.name for q in site.queues()] == ["long", "mcore", "arm"]


def test_a_list_parameter_given_one_string_is_a_one_element_list(grid: ResourcesConfig) -> None:
    assert grid.queue("A", "ce2", "arm").parameter("Tags") == ("GPU",)
    # an undeclared parameter keeps its shape
    assert grid.queue("C", "ce4", "q").parameter("Diskless") == 1


def test_names_are_case_insensitive_and_take_the_declared_spelling(
        grid: ResourcesConfig) -> None:
    q = grid.queue("C", "ce4", "q")
    assert dict(q.parameters()) == {"Diskless": 1, "Flavour": ("vanilla", "chocolate"),
                                    "CPUModel": "Epyc"}
    assert q.parameter("CPUMODEL") == "Epyc"
    assert queues(grid, {"cpumodel": "Epyc"}) == ["C/ce4/q"]
    assert queues(grid, {"maxram": 10000}) == ["A/ce1/mcore"]


def test_sites_without_ces_and_ces_without_queues_offer_no_queue() -> None:
    config = parse_resources("[Sites.S]\nVO = 'x'\n[Sites.T.CEs.c]\n", ORIGIN)
    assert list(config.sites) == ["S", "T"]
    assert list(config.sites["T"].ces) == ["c"]
    assert list(config.queues()) == []
    assert get_eligible_nodes(config, {}) == {}


def test_the_configuration_is_frozen(grid: ResourcesConfig) -> None:
    queue = grid.queue("A", "ce1", "long")
    with pytest.raises(dataclasses.FrozenInstanceError):
        queue.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        queue.parameters()["MaxRAM"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        grid.sites["Z"] = grid.sites["A"]  # type: ignore[index]


@pytest.mark.parametrize(("site", "ce", "queue", "message"), [
    ("Z", "ce1", "long", "grid.toml has no site 'Z'"),
    ("A", "ce9", "long", "grid.toml: site 'A' has no CE 'ce9'"),
    ("A", "ce1", "nope", "grid.toml: CE 'ce1' of site 'A' has no queue 'nope'"),
])
def test_an_unknown_queue_is_not_found(grid: ResourcesConfig, site: str, ce: str, queue: str,
                                       message: str) -> None:
    with pytest.raises(NotFoundError) as info:
        grid.queue(site, ce, queue)
    assert str(info.value) == message


# --- VOs ----------------------------------------------------------------------------------------


def test_a_parameter_set_for_one_vo_makes_the_queue_eligible_for_that_vo_only(
        grid: ResourcesConfig) -> None:
    assert queues(grid, {"Tags": "lhcb-only"}, "lhcb") == ["B/ce3/short"]
    assert queues(grid, {"Tags": "lhcb-only"}, None) == []
    assert queues(grid, {"SoftwareTag": "gauss-v50"}, "lhcb") == [
        "A/ce1/long", "A/ce1/mcore", "A/ce2/arm"]
    assert queues(grid, {"SoftwareTag": "gauss-v50"}, "belle") == []


def test_a_vo_only_sees_the_queues_that_serve_it(grid: ResourcesConfig) -> None:
    everything: dict[str, Any] = {}
    assert queues(grid, everything, "belle") == ["A/ce1/long", "A/ce1/mcore", "A/ce2/arm",
                                                 "C/ce4/q"]
    assert queues(grid, everything, "lhcb") == ["A/ce1/long", "A/ce1/mcore", "A/ce2/arm",
                                                "B/ce3/short", "C/ce4/q"]
    assert queues(grid, everything, "atlas") == ["C/ce4/q"]
    assert serves_vo("lhcb")(grid.queue("B", "ce3", "short"))
    assert not serves_vo("belle")(grid.queue("B", "ce3", "short"))
    assert serves_vo("anyone")(grid.queue("C", "ce4", "q"))


# --- RFC 7 comparisons --------------------------------------------------------------------------


@pytest.mark.parametrize(("requirements", "expected"), [
    # a required parameter the queue does not define makes it ineligible
    ({"Tags": "MultiProcessor"}, ["A/ce1/mcore"]),
    ({"NoSuchThing": "x"}, []),
    # list: any one required value among the queue's values
    ({"Platform": ["aarch64-el9", "x86_64-el8"]}, ["A/ce2/arm", "B/ce3/short"]),
    ({"Platform": "x86_64-el8"}, ["B/ce3/short"]),
    ({"Platform": ["ppc64le"]}, []),
    # number: capacity >= requirement, equality included
    ({"MaxRAM": 8000}, ["A/ce1/mcore", "A/ce2/arm"]),
    ({"MaxRAM": 8000.5}, ["A/ce1/mcore"]),
    ({"NumberOfProcessors": 4}, ["A/ce1/mcore", "A/ce2/arm"]),
    ({"NumberOfProcessors": 9}, []),
    # string: equality, case-sensitive; a list of strings is met by one of them
    ({"CPUModel": "Xeon"}, ["A/ce1/long", "A/ce1/mcore"]),
    ({"CPUModel": "xeon"}, []),
    ({"CPUModel": ["Epyc", "Xeon"]}, ["A/ce1/long", "A/ce1/mcore", "C/ce4/q"]),
    # undeclared: numbers as numbers, anything else as a list
    ({"Diskless": 1}, ["C/ce4/q"]),
    ({"Diskless": 2}, []),
    ({"Flavour": "chocolate"}, ["C/ce4/q"]),
    ({"Flavour": ["mint", "vanilla"]}, ["C/ce4/q"]),
    ({"Flavour": "Vanilla"}, []),
    # every requirement must hold (B/ce3/short has the RAM but states no processors)
    ({"Platform": "x86_64-el9", "MaxRAM": 2000, "NumberOfProcessors": 1},
     ["A/ce1/long", "A/ce1/mcore"]),
])
def test_rfc7_comparisons(grid: ResourcesConfig, requirements: dict[str, Any],
                          expected: list[str]) -> None:
    assert queues(grid, requirements) == expected


def test_a_numeric_parameter_needs_a_capacity_at_least_as_large(grid: ResourcesConfig) -> None:
    lines = explain_requirements(grid, {"MaxRAM": 2001}, "A", "ce1", "long")
    assert lines == [("MaxRAM", False, "MaxRAM: needs ≥ 2001, queue offers 2000")]
    lines = explain_requirements(grid, {"MaxRAM": 2000}, "A", "ce1", "long")
    assert lines == [("MaxRAM", True, "MaxRAM: needs ≥ 2000, queue offers 2000")]


@pytest.mark.parametrize(("requirements", "message"), [
    ([("MaxRAM", 1)], "requirements must be a mapping of parameter to value, got [('MaxRAM', 1)]"),
    ({"": 1}, "requirement names must be non-empty strings, got ''"),
    ({"Tags": "a", "TAGS": "b"}, "requirement 'TAGS' is given twice (names are case-insensitive)"),
    ({"Tags": []}, "requirement 'Tags' is an empty list"),
    ({"Tags": True}, "requirement 'Tags' must be a string, a number or a list of them, got True"),
    ({"Tags": [float("nan")]}, "requirement 'Tags' must be finite, got [nan]"),
    ({"MaxRAM": "lots"}, "requirement 'MaxRAM' must be one number (a number in grid.toml), "
                         "got 'lots'"),
    ({"MaxRAM": [1, 2]}, "requirement 'MaxRAM' must be one number (a number in grid.toml), "
                         "got [1, 2]"),
    ({"CPUModel": 7}, "requirement 'CPUModel' must be a string or a list of strings (a string "
                      "in grid.toml), got 7"),
])
def test_requirements_that_cannot_be_compared_are_refused(grid: ResourcesConfig,
                                                          requirements: Any,
                                                          message: str) -> None:
    with pytest.raises(InvalidRequirementsError) as info:
        eligible_queues(grid, requirements)
    assert str(info.value) == message


# --- CPU time -----------------------------------------------------------------------------------


def test_cpu_time_is_normalised_with_hs06(grid: ResourcesConfig) -> None:
    long = grid.queue("A", "ce1", "long")
    assert long.cpu_factor() == 10.0
    assert long.normalised_cpu_time() == 2880 * 60 * 10


def test_cpu_time_is_normalised_with_si00_over_250(grid: ResourcesConfig) -> None:
    # site B states SI00 2500 = 10 HS06
    assert grid.queue("B", "ce3", "short").normalised_cpu_time() == 30 * 60 * 10


def test_the_nearest_cpu_power_wins(grid: ResourcesConfig) -> None:
    # ce2 states SI00 3000 (12 HS06), nearer than its site's HS06 10
    arm = grid.queue("A", "ce2", "arm")
    assert arm.cpu_factor() == 12.0
    assert arm.normalised_cpu_time() == 60 * 60 * 12


def test_hs06_wins_over_si00_stated_by_the_same_node() -> None:
    config = parse_resources(
        "[Sites.S.CEs.c.Queues.q]\nMaxCPUTime = 10\nSI00 = 500\nHS06 = 3\n", ORIGIN)
    assert config.queue("S", "c", "q").normalised_cpu_time() == 10 * 60 * 3


def test_cpu_time_is_unknown_without_a_factor_or_a_limit(grid: ResourcesConfig) -> None:
    q = grid.queue("C", "ce4", "q")
    assert q.cpu_factor() is None and q.normalised_cpu_time() is None
    config = parse_resources("[Sites.S]\nHS06 = 10\n[Sites.S.CEs.c.Queues.q]\n", ORIGIN)
    assert config.queue("S", "c", "q").cpu_factor() == 10.0
    assert config.queue("S", "c", "q").normalised_cpu_time() is None


# --- selection and levels -----------------------------------------------------------------------


def test_ce_select_and_queue_select_restrict_the_queues_considered(
        grid: ResourcesConfig) -> None:
    def not_ce1(ce: Any) -> bool:
        return bool(ce.name != "ce1")

    def one_core(q: Any) -> bool:
        return q.parameter("NumberOfProcessors") in (None, 1)

    assert eligible_queues(grid, {}, ce_select=not_ce1) == [
        ("A", "ce2", "arm"), ("B", "ce3", "short"), ("C", "ce4", "q")]
    assert eligible_queues(grid, {}, queue_select=one_core) == [
        ("A", "ce1", "long"), ("B", "ce3", "short"), ("C", "ce4", "q")]
    assert eligible_queues(grid, {"MaxRAM": 2000}, ce_select=not_ce1,
                           queue_select=one_core) == [("B", "ce3", "short")]


def test_the_eligible_tree_at_each_level(grid: ResourcesConfig) -> None:
    requirements = {"MaxRAM": 2000}
    assert get_eligible_nodes(grid, requirements, vo="lhcb") == {
        "A": {"ce1": ("long", "mcore"), "ce2": ("arm",)}, "B": {"ce3": ("short",)}}
    # a CE or site is eligible when one of its queues is; the CE "empty" never is
    assert get_eligible_nodes(grid, requirements, vo="lhcb", level="ce") == {
        "A": ("ce1", "ce2"), "B": ("ce3",)}
    assert get_eligible_nodes(grid, requirements, vo="lhcb", level="site") == ("A", "B")
    assert get_eligible_nodes(grid, requirements, vo="belle", level="site") == ("A",)
    tree = get_eligible_nodes(grid, requirements)
    with pytest.raises(TypeError):
        tree["X"] = {}  # type: ignore[index]


def test_an_unknown_level_is_a_programming_error(grid: ResourcesConfig) -> None:
    with pytest.raises(ValueError, match="level must be 'site', 'ce' or 'queue', got 'cluster'"):
        get_eligible_nodes(grid, {}, level="cluster")  # type: ignore[call-overload]


# --- explanations -------------------------------------------------------------------------------


def test_explain_says_per_requirement_what_the_queue_offers(grid: ResourcesConfig) -> None:
    requirements = {"Platform": ["aarch64-el9", "x86_64-el9"], "Tags": "GPU", "MaxRAM": 4000,
                    "CPUModel": "Xeon", "Flavour": "mint", "SoftwareTag": "gauss-v50"}
    assert explain_requirements(grid, requirements, "A", "ce1", "long", vo="lhcb") == [
        ("VO", True, "VO: needs 'lhcb', queue serves 'lhcb', 'belle'"),
        ("Platform", True, "Platform: needs one of 'aarch64-el9', 'x86_64-el9', "
                           "queue offers 'x86_64-el9'"),
        ("Tags", False, "Tags: needs 'GPU', queue does not define it"),
        ("MaxRAM", False, "MaxRAM: needs ≥ 4000, queue offers 2000"),
        ("CPUModel", True, "CPUModel: needs 'Xeon', queue offers 'Xeon'"),
        ("Flavour", False, "Flavour: needs 'mint', queue does not define it"),
        ("SoftwareTag", True, "SoftwareTag: needs 'gauss-v50', "
                              "queue offers 'gauss-v50', 'davinci-v46'"),
    ]


def test_explain_names_a_vo_the_queue_does_not_serve(grid: ResourcesConfig) -> None:
    assert explain_requirements(grid, {"Diskless": 0.5}, "B", "ce3", "short", vo="belle") == [
        ("VO", False, "VO: needs 'belle', queue serves 'lhcb'"),
        ("Diskless", False, "Diskless: needs ≥ 0.5, queue does not define it"),
    ]
    assert explain_requirements(grid, {"Diskless": 0.5}, "C", "ce4", "q", vo="belle") == [
        ("VO", True, "VO: needs 'belle', queue serves every VO"),
        ("Diskless", True, "Diskless: needs ≥ 0.5, queue offers 1"),
    ]


def test_unmet_names_the_requirements_no_queue_meets_alone(grid: ResourcesConfig) -> None:
    requirements = {"SoftwareTag": "gauss-v99", "MaxRAM": 4000, "Tags": ["FPGA", "TPU"]}
    assert unmet_requirements(grid, requirements, vo="lhcb") == ["SoftwareTag", "Tags"]
    assert conflicting_requirements(grid, requirements, vo="lhcb") == ["SoftwareTag"]
    assert no_match_reason(grid, requirements, vo="lhcb") == (
        "no queue offers SoftwareTag 'gauss-v99'; no queue offers Tags one of 'FPGA', 'TPU'")


def test_requirements_met_only_apart_are_named_together(grid: ResourcesConfig) -> None:
    # aarch64 is at A/ce2/arm only, 9000 MB at A/ce1/mcore only
    requirements = {"MaxRAM": 9000, "Platform": "aarch64-el9", "NumberOfProcessors": 2}
    assert eligible_queues(grid, requirements) == []
    assert unmet_requirements(grid, requirements) == []
    assert conflicting_requirements(grid, requirements) == ["MaxRAM", "Platform"]
    assert no_match_reason(grid, requirements) == (
        "no queue offers MaxRAM ≥ 9000 together with Platform 'aarch64-el9'")


def test_nothing_is_unmet_when_a_queue_is_eligible(grid: ResourcesConfig) -> None:
    requirements = {"MaxRAM": 9000}
    assert unmet_requirements(grid, requirements) == []
    assert conflicting_requirements(grid, requirements) == []
    assert no_match_reason(grid, requirements) is None


def test_with_no_queue_to_consider_every_requirement_is_unmet(grid: ResourcesConfig) -> None:
    def none(q: Any) -> bool:
        return False

    assert unmet_requirements(grid, {"MaxRAM": 1, "Tags": "x"}, queue_select=none) == [
        "MaxRAM", "Tags"]
    assert no_match_reason(grid, {"MaxRAM": 1}, queue_select=none) == (
        "no queue is configured or selected")
    assert no_match_reason(grid, {}, vo="lhcb", queue_select=none) == (
        "no configured or selected queue serves VO 'lhcb'")


# --- bad configurations -------------------------------------------------------------------------

Q = '[Sites."LCG.CERN.cern".CEs."ce1.cern.ch".Queues.long]\n'
QP = 'Sites."LCG.CERN.cern".CEs."ce1.cern.ch".Queues.long'


@pytest.mark.parametrize(("text", "message"), [
    (Q + 'MaxRAM = "lots"\n', f"{QP}.MaxRAM must be a number, got 'lots'"),
    (Q + "MaxCPUTime = 0\n", f"{QP}.MaxCPUTime must be a positive number, got 0"),
    (Q + "NumberOfProcessors = -4\n",
     f"{QP}.NumberOfProcessors must be a positive number, got -4"),
    (Q + "HS06 = nan\n", f"{QP}.HS06 must be a finite number, got nan"),
    (Q + "SI00 = true\n", f"{QP}.SI00 must be a number, got True"),
    (Q + "Enabled = true\n",
     f"{QP}.Enabled must be a string, a number or a list of them, got True"),
    (Q + 'Tags = ["GPU", false]\n', f"{QP}.Tags[1] must be a string or a number, got False"),
    (Q + "Extra = [[1, 2]]\n", f"{QP}.Extra[0] must be a string or a number, got [1, 2]"),
    (Q + "Since = 2024-01-01\n",
     f"{QP}.Since must be a string, a number or a list of them, got datetime.date(2024, 1, 1)"),
    ('[JobDescription]\nCPUModel = "string"\n' + Q + 'CPUModel = ["Xeon"]\n',
     f"{QP}.CPUModel must be a string, got ['Xeon']"),
    ('[JobDescription]\nRAM = "number"\n' + Q + 'RAM = "4GB"\n',
     f"{QP}.RAM must be a number, got '4GB'"),
    (Q + "MaxRAM = 1\nmaxram = 2\n",
     f"{QP}.maxram repeats MaxRAM (parameter names are case-insensitive)"),
    (Q + "[Sites.\"LCG.CERN.cern\".CEs.\"ce1.cern.ch\".Queues.long.Queues.x]\n",
     f"{QP}.Queues is a table, but only VOs may be tables in a queue"),
    ('[Sites."LCG.CERN.cern".Queues.long]\n',
     'Sites."LCG.CERN.cern".Queues is a table, but only CEs and VOs may be tables in a site'),
    ('[Sites."LCG.CERN.cern".CEs."ce1.cern.ch".CEs.x]\n',
     'Sites."LCG.CERN.cern".CEs."ce1.cern.ch".CEs is a table, but only Queues and VOs may be '
     'tables in a CE'),
    ('[Sites."LCG.CERN.cern".VOs.lhcb.CEs.x]\n',
     'Sites."LCG.CERN.cern".VOs.lhcb.CEs is a table, but a VO section holds only parameters'),
    ('[Sites."LCG.CERN.cern".VOs.lhcb]\nMaxRAM = "lots"\n',
     "Sites.\"LCG.CERN.cern\".VOs.lhcb.MaxRAM must be a number, got 'lots'"),
    ('[Sites."LCG.CERN.cern"]\nCEs = "ce1.cern.ch"\n',
     "Sites.\"LCG.CERN.cern\".CEs must be a table of computing elements, got 'ce1.cern.ch'"),
    ('[Sites."LCG.CERN.cern".CEs]\n"ce1.cern.ch" = 3\n',
     'Sites."LCG.CERN.cern".CEs."ce1.cern.ch" must be a table, got 3'),
    ('[Sites."LCG.CERN.cern".CEs."ce1.cern.ch"]\nQueues = ["long"]\n',
     "Sites.\"LCG.CERN.cern\".CEs.\"ce1.cern.ch\".Queues must be a table of queues, "
     "got ['long']"),
    ('[Sites."LCG.CERN.cern"]\nVOs = "lhcb"\n',
     "Sites.\"LCG.CERN.cern\".VOs must be a table of VO sections, got 'lhcb'"),
    ('[Sites.""]\n', 'Sites."" must have a non-empty name'),
    ("Sites = 3\n", "Sites must be a table of sites, got 3"),
    ('[Site."LCG.CERN.cern"]\n',
     "Site is not a section of a resources file (there are JobDescription and Sites)"),
    ('[JobDescription]\nTags = "set"\n',
     "JobDescription.Tags must be \"string\", \"list\" or \"number\", got 'set'"),
    ('[JobDescription]\nTags = "list"\ntags = "list"\n',
     "JobDescription.tags repeats Tags (parameter names are case-insensitive)"),
    ('[JobDescription]\nmaxram = "list"\n',
     "JobDescription.maxram must be \"number\" (MaxRAM is a capacity), got 'list'"),
    ('JobDescription = ["Tags"]\n',
     "JobDescription must be a table of parameter = type, got ['Tags']"),
])
def test_bad_configuration_names_the_file_the_place_and_the_reason(text: str,
                                                                   message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_resources(text, "conf/bad.toml")
    assert str(info.value) == f"conf/bad.toml: {message}"


def test_a_file_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "resources.toml"
    path.write_text("[Sites\n")
    with pytest.raises(ConfigurationError) as info:
        load_resources(path)
    assert str(info.value).startswith(f"resources file {path} is not valid TOML: ")


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigurationError) as info:
        load_resources(path)
    assert str(info.value) == f"resources file {path} does not exist"


def test_load_names_the_file_in_messages(tmp_path: Path) -> None:
    path = tmp_path / "resources.toml"
    path.write_text("[Sites.S]\nMaxRAM = 'lots'\n")
    with pytest.raises(ConfigurationError) as info:
        load_resources(path)
    assert str(info.value) == f"{path}: Sites.S.MaxRAM must be a number, got 'lots'"
