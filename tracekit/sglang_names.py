"""The SGLang per-rank trace file-name grammar: the one owner (capture's client and ingest's discovery read it).

``[<prefix>-]<profile_id>-TP-<tp>[-DP-<dp>][-PP-<pp>][-EP-<ep>][-<STAGE>].trace.json[.gz]``
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SGLANG_NAME", "SglangName", "parse_sglang_name"]

SGLANG_NAME = re.compile(
    r"^(?:(?P<prefix>.+?)-)?(?P<pid>[^-]+)-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?(?:-EP-(?P<ep>\d+))?"
    r"(?:-(?P<stage>[A-Za-z]+))?\.trace\.json(?:\.gz)?$"
)


@dataclass(frozen=True)
class SglangName:
    prefix: str | None
    profile_id: str
    tp: int
    dp: int | None
    pp: int | None
    ep: int | None
    stage: str | None


def parse_sglang_name(name: str) -> SglangName | None:
    """The parts of an SGLang trace file name; None when ``name`` does not follow the grammar."""
    m = SGLANG_NAME.match(name)
    if m is None:
        return None

    def opt(g: str) -> int | None:
        return int(m[g]) if m[g] is not None else None

    return SglangName(m["prefix"], m["pid"], int(m["tp"]), opt("dp"), opt("pp"), opt("ep"), m["stage"])
