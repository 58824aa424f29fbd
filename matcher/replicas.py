"""/api/v1/replicas: the VO's replica catalogue. Users and operators look replicas up;
operators register and remove them (the optimizer chain sends a job with InputData only to
sites that reach a replica of each of its files)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from matcher import schemas
from matcher.api import JSON, Call, Param, endpoint
from matcher.auth import OPERATOR, USER
from matcher.views import iso
from optimizers.datalocation import unknown_storage
from taskqueue.files.replicas import add_replicas, list_replicas, remove_replicas

bp = Blueprint("replicas", __name__, url_prefix="/api/v1/replicas")


@endpoint(bp, "GET", "", tag="replicas", roles=(USER, OPERATOR),
          summary="The VO's replicas: of one file, at a storage element, or under a path",
          query=(Param("lfn", "only the replicas of this file (with or without LFN:)",
                       text=schemas.LFN),
                 Param("se", "only the replicas at this storage element",
                       text=schemas.SE_NAME),
                 Param("prefix", "only files whose LFN starts with this"),
                 Param("limit", "replicas at most", "integer", minimum=1)),
          responses={200: ("Replicas, by LFN then storage element", schemas.REPLICA_LIST)})
def get_replicas(call: Call) -> dict[str, Any]:
    q = call.query
    limit = min(q.get("limit", 1000), call.runtime.settings.matcher.max_page_size)
    rows = call.runtime.transaction(lambda session: list_replicas(
        session, call.principal.vo, lfns=[q["lfn"]] if q.get("lfn") else [], se=q.get("se"),
        prefix=q.get("prefix"), limit=limit))
    return {"replicas": [{"lfn": r.lfn, "se": r.se, "registered_at": iso(r.registered_at)}
                         for r in rows]}


@endpoint(bp, "POST", "", tag="replicas", roles=(OPERATOR,),
          summary="Register replicas (LFN at a storage element); those known already stay",
          body={JSON: schemas.REPLICAS_ADD},
          responses={200: ("How many were new, and storage elements no site reads from",
                           schemas.REPLICAS_CHANGED)})
def post_replicas(call: Call) -> dict[str, Any]:
    pairs = [(r["lfn"], r["se"]) for r in call.body["replicas"]]
    added = call.runtime.transaction(lambda session: add_replicas(
        session, call.principal.vo, pairs, now=call.now))
    return {"added": added, "removed": 0, "warnings": unknown_storage(
        call.runtime.resources(), call.principal.vo, {se for _lfn, se in pairs})}


@endpoint(bp, "POST", "/remove", tag="replicas", roles=(OPERATOR,),
          summary="Remove the replicas of files (at one storage element, when given)",
          body={JSON: schemas.REPLICAS_REMOVE},
          responses={200: ("How many were removed", schemas.REPLICAS_CHANGED)})
def remove(call: Call) -> dict[str, Any]:
    removed = call.runtime.transaction(lambda session: remove_replicas(
        session, call.principal.vo, call.body["lfns"], se=call.body.get("se")))
    return {"added": 0, "removed": removed, "warnings": []}
