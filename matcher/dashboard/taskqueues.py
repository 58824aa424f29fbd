"""/ui/taskqueues and /ui/taskqueues/<id>: the VO's task queues, their definition, waiting jobs,
priority and share, SubmitPool and the queues whose pilots could serve them."""

from __future__ import annotations

import json
from typing import Any

from flask import Response, request

from matcher.dashboard.web import Page, bp, page, query_url, render
from matcher.problems import Problem
from optimizers.outlook import queue_reach
from taskqueue.core.errors import NotFoundError
from taskqueue.db.database import Session
from taskqueue.db.models import SubmitPool
from taskqueue.queues.shares import share_table
from taskqueue.queues.submitpools import queues_of_pool
from taskqueue.queues.taskqueues import next_jobs, queue_page

#: Jobs shown on a task queue's page: the next ones its pilots would get.
NEXT_JOBS = 20
FILTERS = ("owner_group", "job_type")


def int_arg(name: str) -> int | None:
    """An integer query parameter, or None; a clear 400 for anything else."""
    text = request.args.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or len(text) > 18:
        raise Problem(400, f"{name} must be a whole number, got {text[:40]!r}")
    return int(text)


def text_arg(name: str, limit: int = 255) -> str | None:
    text = request.args.get(name, "").strip()
    if "\x00" in text or len(text) > limit:
        raise Problem(400, f"{name} must be at most {limit} characters of text")
    return text or None


@bp.get("/taskqueues")
@page(operator=True)
def taskqueues(p: Page) -> Response:
    args = {name: text_arg(name, 128) for name in FILTERS}
    after = int_arg("after") or 0
    limit = p.page_size

    def work(session: Session) -> dict[str, Any]:
        shares = {e.owner_group: e for e in share_table(session, p.runtime.settings, p.vo)}
        return {"queues": queue_page(session, p.vo, after=after, limit=limit,
                                     owner_group=args["owner_group"],
                                     job_type=args["job_type"]),
                "shares": shares}

    data = p.runtime.transaction(work)
    infos = data["queues"]
    default = p.runtime.settings.taskqueue.default_share
    return render("taskqueues.html", viewer=p.viewer, queues=infos, args=args,
                  shares={i.queue.owner_group: data["shares"][i.queue.owner_group].share
                          if i.queue.owner_group in data["shares"] else default
                          for i in infos},
                  waiting=sum(i.waiting for i in infos),
                  next_url=query_url("ui.taskqueues", args, after=infos[-1].queue.id)
                  if len(infos) == limit else None,
                  first_url=query_url("ui.taskqueues", args) if after else None)


@bp.get("/taskqueues/<int:tq_id>")
@page(operator=True)
def taskqueue(p: Page, tq_id: int) -> Response:
    config = p.runtime.resources()

    def work(session: Session) -> dict[str, Any]:
        found = queue_page(session, p.vo, after=0, limit=1, ids=[tq_id])
        if not found:
            raise NotFoundError(f"task queue {tq_id} does not exist in VO {p.vo}")
        info = found[0]
        pool = (session.get(SubmitPool, info.queue.submit_pool)
                if info.queue.submit_pool else None)
        pool_queues = queues_of_pool(session, pool.id) if pool else []
        eligible = ["/".join(key[1:]) for key, r
                    in queue_reach(session, config, [p.vo], only=tq_id).items() if tq_id in r]
        jobs = next_jobs(session, tq_id, limit=NEXT_JOBS)
        shares = {e.owner_group: e for e in share_table(session, p.runtime.settings, p.vo)}
        return {"info": info, "pool": pool, "pool_queues": pool_queues, "eligible": eligible,
                "jobs": jobs, "share": shares.get(info.queue.owner_group)}

    data = p.runtime.transaction(work)
    pool = data["pool"]
    share = data["share"]
    return render("taskqueue.html", viewer=p.viewer, info=data["info"],
                  q=data["info"].queue, pool=pool,
                  requirements=json.dumps(json.loads(pool.requirements), indent=2,
                                          sort_keys=True) if pool else "",
                  pool_queues=data["pool_queues"], eligible=data["eligible"],
                  jobs=data["jobs"],
                  share=share.share if share else p.runtime.settings.taskqueue.default_share,
                  share_source=share.source if share else "default")
