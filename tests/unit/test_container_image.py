"""ContainerImage: a job's own image, and the tag that sends it to pilots that can run it."""

from __future__ import annotations

import pytest

from optimizers.description import JobDescriptionError
from optimizers.jdl import parse_jdl


def _one(text: str):  # type: ignore[no-untyped-def]
    [job] = parse_jdl(text)
    return job


def test_an_image_folder_asks_for_a_pilot_that_runs_containers() -> None:
    job = _one('[ Executable = "/bin/sh"; Tags = {"GPU"}; '
               'ContainerImage = "/cvmfs/unpacked.cern.ch/registry.hub.docker.com/lib/el9"; ]')
    assert job.container_image == "/cvmfs/unpacked.cern.ch/registry.hub.docker.com/lib/el9"
    assert job.tags == frozenset({"GPU", "container"})


def test_an_image_file_asks_for_apptainer() -> None:
    job = _one('[ Executable = "/bin/sh"; ContainerImage = "/cvmfs/images/el9.sif"; ]')
    assert job.tags == frozenset({"apptainer"})


def test_no_image_no_tag() -> None:
    job = _one('[ Executable = "/bin/sh"; ]')
    assert job.container_image is None and job.tags == frozenset()


@pytest.mark.parametrize("image", ["el9.sif", "images/el9", "/cvmfs/../etc", "/a\tb",
                                   "/" + "x" * 1100])
def test_an_image_that_is_no_absolute_path_is_refused_naming_the_attribute(image: str) -> None:
    with pytest.raises(JobDescriptionError, match="ContainerImage must be the absolute path"):
        parse_jdl(f'[ Executable = "/bin/sh"; ContainerImage = "{image}"; ]')
