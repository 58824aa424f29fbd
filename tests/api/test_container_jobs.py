"""A job that asks for its own container image goes only to pilots that can run one, and
its payload says which image, through the Flask test client on every database."""

from __future__ import annotations

from tests.api.helpers import PILOT_REF, Api

IMAGE = "/cvmfs/unpacked.cern.ch/registry.hub.docker.com/library/almalinux:9"


def test_an_image_job_goes_to_a_pilot_that_runs_containers_only(
        client: Api, user_token: str, pilot_token: str) -> None:
    [job_id] = client.submit_jdl(user_token,
                                 f'[ Executable = "/bin/sh"; ContainerImage = "{IMAGE}"; ]')
    bare = client.match(pilot_token, pilot_reference=PILOT_REF)
    assert bare["jobs"] == [] and bare["no_match"]["reason"] == "no_matching_job"
    isolated = client.match(pilot_token, pilot_reference=PILOT_REF,
                            tags=["isolated", "container", "bwrap"])
    [job] = isolated["jobs"]
    assert job["job_id"] == job_id and job["container_image"] == IMAGE


def test_a_job_without_an_image_has_none_in_its_payload(
        client: Api, user_token: str, pilot_token: str) -> None:
    client.submit_jdl(user_token)
    [job] = client.match(pilot_token, pilot_reference=PILOT_REF)["jobs"]
    assert job["container_image"] is None
