"""A job's memory reads the same in every view: "any memory" when it asks for none, else MB."""

from __future__ import annotations

from taskqueue.core.buckets import memory_text
from taskqueue.core.definitions import JobRequirements, TaskQueueDefinition
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.matching.explain import explain_match


def test_memory_text() -> None:
    assert (memory_text(0), memory_text(None), memory_text(2048)) == (
        "any memory", "any memory", "2,048 MB")


def test_explain_says_it_the_same_way() -> None:
    definition = TaskQueueDefinition.for_job(
        JobRequirements(vo="lhcb", owner="alice", owner_group="lhcb_user"), Settings())
    resource = parse_resource({"vo": "lhcb", "memory": 4096})
    memory = [r for r in explain_match(definition, resource, lambda _: True)
              if r.rule == "memory"]
    assert [(r.holds, r.detail) for r in memory] == [
        (True, "job needs any memory (bucket); resource offers 4,096 MB")]
