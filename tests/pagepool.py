"""A small simulated KV page pool, the way an inference engine keeps one, for the engine-pattern tests.

* ``req_to_token[R, C]`` (int32, on the test device): one row per live request, one slot id per token;
  slot ``= page * page_size + offset``. A host mirror is edited and copied into the device table in
  place by ``sync()``, so the device buffer keeps its address (CUDA-graph replay reads it).
* Pages come from a shuffled free list (random physical pages). Page 0 and row 0 are reserved, as an
  engine reserves them for padding: row 0 holds slot 0 everywhere, so a padded batch entry
  (pool index 0, length 1, plus any draft tokens) reads page 0.
* Prefix sharing: a new request may start with the first ``k`` full pages of a live request (the same
  physical pages, reference counted), like a radix/prefix cache hit.
* Requests finish: their pages go back to the free list (when no other request shares them) and
  their row to the free row list, from which the next request takes it; the row's old entries stay
  behind as stale data, as they do in an engine.

The pool is the oracle: ``block_table`` and ``token_slots`` say, from its own bookkeeping (not from the
table), which pages and slots a request owns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

STALE = -777  # what a never-written table entry holds


@dataclass
class Request:
    rid: int
    row: int
    length: int = 0
    pages: list = field(default_factory=list)


class PagePool:
    def __init__(self, *, page_size: int, num_pages: int, max_requests: int, max_context_len: int,
                 device="cpu", seed: int = 0):
        self.page_size = page_size
        self.max_context_len = max_context_len
        self.rng = random.Random(seed)
        free_pages = list(range(1, num_pages))  # page 0: padding
        self.rng.shuffle(free_pages)
        self.free_pages = free_pages
        self.refcount = [0] * num_pages
        self.free_rows = list(range(max_requests, 0, -1))  # row 0: padding; pop() takes the lowest first
        self.host = torch.full((max_requests + 1, max_context_len), STALE, dtype=torch.int32)
        self.host[0] = 0
        self.req_to_token = self.host.to(device, copy=True)  # a copy on every device: only sync() updates it
        self.requests: dict[int, Request] = {}
        self._next_rid = 0

    # -- bookkeeping -------------------------------------------------------------------------------

    def _take_page(self) -> int:
        if not self.free_pages:
            raise RuntimeError("page pool exhausted")
        page = self.free_pages.pop()
        self.refcount[page] = 1
        return page

    def _drop_page(self, page: int) -> None:
        self.refcount[page] -= 1
        if self.refcount[page] == 0:
            # Insert at a random place: the next allocations get scattered physical pages.
            self.free_pages.insert(self.rng.randrange(len(self.free_pages) + 1), page)

    def admit(self, prompt_len: int, share_from: int | None = None, shared_pages: int = 0) -> int:
        """A new request of ``prompt_len`` tokens; optionally its first ``shared_pages`` pages are
        those of request ``share_from`` (clipped to the full pages both have)."""
        if not self.free_rows:
            raise RuntimeError("no free request row")
        if prompt_len > self.max_context_len:
            raise ValueError("prompt longer than the table")
        req = Request(self._next_rid, self.free_rows.pop())
        self._next_rid += 1
        if share_from is not None and shared_pages > 0:
            donor = self.requests[share_from]
            shared_pages = min(shared_pages, donor.length // self.page_size, prompt_len // self.page_size)
            for page in donor.pages[:shared_pages]:
                self.refcount[page] += 1
                req.pages.append(page)
            req.length = shared_pages * self.page_size
            self._write(req, 0, req.length)
        self.requests[req.rid] = req
        self.extend(req.rid, prompt_len - req.length)
        return req.rid

    def extend(self, rid: int, n: int = 1) -> None:
        """Append ``n`` tokens to request ``rid`` (a decode step, or draft tokens' slots)."""
        req = self.requests[rid]
        if req.length + n > self.max_context_len:
            raise ValueError("request would outgrow the table")
        start = req.length
        while len(req.pages) * self.page_size < start + n:
            req.pages.append(self._take_page())
        req.length = start + n
        self._write(req, start, req.length)

    def truncate(self, rid: int, new_length: int) -> None:
        """Drop the tokens past ``new_length`` (rejected draft tokens); frees pages no longer used."""
        req = self.requests[rid]
        keep = -(-new_length // self.page_size)
        for page in req.pages[keep:]:
            self._drop_page(page)
        del req.pages[keep:]
        req.length = new_length

    def retire(self, rid: int) -> None:
        """The request finished: pages and row go back; the row's entries stay as stale data."""
        req = self.requests.pop(rid)
        for page in req.pages:
            self._drop_page(page)
        self.free_rows.append(req.row)

    def _write(self, req: Request, start: int, end: int) -> None:
        pos = torch.arange(start, end)
        pages = torch.tensor(req.pages, dtype=torch.int64)[pos // self.page_size]
        self.host[req.row, start:end] = (pages * self.page_size + pos % self.page_size).to(torch.int32)

    def sync(self) -> None:
        """Copy the host mirror into the device table, in place."""
        self.req_to_token.copy_(self.host)

    # -- the oracle --------------------------------------------------------------------------------

    def live(self) -> list[int]:
        return list(self.requests)

    def rows(self, rids) -> list[int]:
        return [self.requests[r].row for r in rids]

    def lengths(self, rids) -> list[int]:
        return [self.requests[r].length for r in rids]

    def block_table(self, rid: int, length: int | None = None) -> list[int]:
        """Physical pages holding the first ``length`` tokens (default: all) of request ``rid``."""
        req = self.requests[rid]
        length = req.length if length is None else length
        assert length <= len(req.pages) * self.page_size, "those tokens have no slots"
        return list(req.pages[: -(-length // self.page_size)])

    def token_slots(self, rid: int) -> list[int]:
        req = self.requests[rid]
        return [req.pages[j // self.page_size] * self.page_size + j % self.page_size for j in range(req.length)]

    def check_shared(self) -> int:
        """How many pages are shared by more than one request right now (the tests want some)."""
        return sum(1 for c in self.refcount if c > 1)


def populate(pool: PagePool, n: int, *, min_len: int, max_len: int, share_prob: float = 0.5) -> list[int]:
    """Admit ``n`` requests of random lengths; about ``share_prob`` of them share a live request's prefix."""
    rids = []
    for _ in range(n):
        length = pool.rng.randint(min_len, max_len)
        live = pool.live()
        if live and pool.rng.random() < share_prob:
            donor = pool.rng.choice(live)
            rids.append(pool.admit(length, share_from=donor, shared_pages=pool.rng.randint(1, 4)))
        else:
            rids.append(pool.admit(length))
    return rids
