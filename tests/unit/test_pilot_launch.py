"""What the site director gives a queue's pilots is what explain, the watchdog and reach judge:
for every queue of conf/resources.toml and of generated configurations, the description a
director's pilot presents at its start (built through the pilot's own parser and match request)
equals optimizers.queueresources' description, field by field, and the batch system's wall
limit is the pilot's time left."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents.ce.config import CE_PARAMETERS
from optimizers.queueresources import (
    NOT_ATTRIBUTES,
    PILOT_MARGIN,
    pilot_launch,
    queue_resource_data,
    resource_for_queue,
)
from optimizers.resources import load_resources
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from tests.pilotlaunch import START, director_pilot

REPO = Path(__file__).resolve().parent.parent.parent
POOLS = ["0" * 40, "f" * 40]


@pytest.fixture(autouse=True)
def _no_features(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MACHINEFEATURES", "JOBFEATURES", "JOBSTATUS"):
        monkeypatch.delenv(name, raising=False)


def _check_every_queue(resources: Path, workdir: Path) -> int:
    """Each queue and VO of ``resources``: the pilot's description is explain's; the number of
    (queue, VO) pairs checked."""
    config = load_resources(resources)
    checked = 0
    for q in config.queues():
        vos = q.parameter("VO")
        for vo in ([str(v) for v in vos] if isinstance(vos, tuple)
                   else [str(vos)] if vos is not None else ["lhcb", "belle"]):
            started = director_pilot(Settings(), resources, q.site, q.ce, q.name, vo, POOLS,
                                     workdir)
            expected = queue_resource_data(config, q.site, q.ce, q.name, vo,
                                           submit_pools=POOLS,
                                           pilot_reference="local-0123456789abcdef")
            where = f"{q.site}/{q.ce}/{q.name} for {vo}"
            launch = pilot_launch(config, q.site, q.ce, q.name, vo)
            if launch.cpu_time == 0:  # the margin takes the whole wall limit
                assert started.request is None, where
                continue
            got = started.request
            assert got is not None, where
            for key in sorted(set(got) | set(expected)):
                assert got.get(key) == expected.get(key), f"{where}: field {key}"
            assert parse_resource(got) == resource_for_queue(
                config, q.site, q.ce, q.name, vo, submit_pools=POOLS,
                pilot_reference="local-0123456789abcdef"), where
            # The batch system's wall limit is the pilot's own.
            assert started.pilot.limits(START).seconds_left(START) == \
                started.spec.wall_minutes * 60, where
            assert started.spec.cores == got["processors"], where
            assert started.spec.memory_mb == got.get("memory"), where
            # A queue's NumberOfGPUs: the pilot hands out devices 0..N-1 and offers N.
            gpus = launch.gpus
            assert got.get("gpus", 0) == gpus, where
            assert started.pilot.options.gpus == tuple(map(str, range(gpus))), where
            checked += 1
    return checked


def test_every_queue_of_the_shipped_configuration(tmp_path: Path) -> None:
    assert _check_every_queue(REPO / "conf" / "resources.toml", tmp_path) >= 10


def test_the_demo_queue_offers_its_hour_less_the_margin(tmp_path: Path) -> None:
    resources = REPO / "conf" / "resources.toml"
    started = director_pilot(Settings(), resources, "DIRAC.Demo.local", "localhost", "local",
                             "lhcb", [], tmp_path)
    assert started.spec.wall_minutes == 60
    assert started.request is not None
    # MaxCPUTime 60 minutes at 1 HS06: 3,600 s less the pilot's margin, per core.
    assert started.request["cpu_time"] == 3600 - PILOT_MARGIN
    assert "--wall-limit" in started.spec.arguments


def test_a_gpu_queue_starts_pilots_that_hand_out_its_gpus(tmp_path: Path) -> None:
    resources = tmp_path / "resources.toml"
    resources.write_text('[JobDescription]\nNumberOfGPUs = "number"\n'
                         '[Sites."S.gpu.org".CEs.ce.Queues.gpu]\n'
                         'NumberOfProcessors = 2\nNumberOfGPUs = 2\nMaxCPUTime = 60\n',
                         encoding="utf-8")
    started = director_pilot(Settings(), resources, "S.gpu.org", "ce", "gpu", "lhcb", [],
                             tmp_path)
    arguments = started.spec.arguments
    assert arguments[arguments.index("--gpus") + 1] == "0,1"
    assert started.pilot.options.gpus == ("0", "1")
    assert started.request is not None and started.request["gpus"] == 2
    assert "NumberOfGPUs" not in started.request  # not a node attribute: the rule reads gpus


_LEVELS = ("site", "ce", "queue")


def _parameters(rng: random.Random, level: str) -> list[str]:
    out = []
    if rng.random() < 0.3:
        out.append(f"HS06 = {rng.choice([1.0, 8.5, 10.0, 12.25])}")
    elif rng.random() < 0.2:
        out.append(f"SI00 = {rng.choice([2000, 2500, 3111])}")
    for key, values in (("MaxCPUTime", [2, 60, 61, 1440, 2880.5]),
                        ("WallTime", [3, 90, 4320]),
                        ("NumberOfProcessors", [1, 4, 8]),
                        ("MaxRAM", [1500, 2048, 16384.7]),
                        ("NumberOfGPUs", [1, 2, 4])):
        if rng.random() < 0.25:
            out.append(f"{key} = {rng.choice(values)}")
    if rng.random() < 0.3:
        out.append(rng.choice(['Platform = "x86_64-el9"',
                               'Platform = ["x86_64-el9", "x86_64-el8"]']))
    if rng.random() < 0.3:
        out.append(rng.choice(['Tags = ["GPU", "MultiProcessor"]', 'Tags = "GPU"']))
    if rng.random() < 0.2:
        out.append(rng.choice(['RequiredTags = "GPU"', 'RequiredTags = ["GPU", "Big"]']))
    if rng.random() < 0.3:
        out.append(rng.choice(['CPUModel = "AMD EPYC"', 'SoftwareTag = ["a", "b", 3]',
                               'Extra = 7', 'Ratio = 0.5']))
    if level == "ce" and rng.random() < 0.3:
        out += ['MaxWaitingPilots = 4', 'BatchQueue = "q"', 'Account = "a"']
    return out


def _configuration(rng: random.Random) -> str:
    lines = ['[JobDescription]', 'VO = "list"', 'Platform = "list"', 'Tags = "list"',
             'RequiredTags = "list"', 'SoftwareTag = "list"', 'NumberOfGPUs = "number"', '']
    for s in range(rng.randint(1, 3)):
        site = f"S{s}.gen.org"
        lines += [f'[Sites."{site}"]', 'VO = ["lhcb", "belle"]', *_parameters(rng, "site")]
        if rng.random() < 0.3:
            lines += [f'[Sites."{site}".VOs.belle]', *_parameters(rng, "site")]
        for c in range(rng.randint(1, 2)):
            ce = f"ce{c}.{site}"
            lines += [f'[Sites."{site}".CEs."{ce}"]', *_parameters(rng, "ce")]
            for n in range(rng.randint(1, 3)):
                lines += [f'[Sites."{site}".CEs."{ce}".Queues.q{n}]', *_parameters(rng, "queue")]
                if rng.random() < 0.3:
                    lines += [f'[Sites."{site}".CEs."{ce}".Queues.q{n}.VOs.lhcb]',
                              *_parameters(rng, "queue")]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(25))
def test_every_queue_of_generated_configurations(tmp_path: Path, seed: int) -> None:
    resources = tmp_path / "resources.toml"
    resources.write_text(_configuration(random.Random(seed)), encoding="utf-8")
    assert _check_every_queue(resources, tmp_path) >= 1


def test_ce_parameters_are_never_node_attributes() -> None:
    assert CE_PARAMETERS <= NOT_ATTRIBUTES
