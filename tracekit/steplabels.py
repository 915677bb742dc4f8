"""The step-label grammar: which CPU ranges are steps, and what their names say (mode, batch size, tokens, id).

The single owner of step annotations; ingest (``finalize_rank``) and ``analyze --steps-from`` import it.

Families, most specific first (only the first family present in a rank becomes steps; the others stay
ranges, so nested conventions are never counted twice):

========================  =====================================================  ============================
family                    example                                                fields
========================  =====================================================  ============================
``tk.fwd``                ``tk.fwd[DECODE bs=32 tok=32]``                         mode, bs, tok
``sglang.step``           ``step[EXTEND bs=15 toks=15360]``, ``step[DECODE bs=8]``  mode, bs, tok
``vllm.execute``          ``execute_32_context_0(…)_generation_32(…)``,            tok, ctx, gen -> mode, bs
                          ``execute_context_1(888_788544)_generation_0(0)``
``user.label``            ``forward#3:decode:bs=32``, ``forward#0:prefill:tokens=512``,  id, mode, bs, tok
                          ``decode[bs=8]``, ``prefill tokens=2048``, ``step#4 decode bs=16``,
                          ``iteration_7``
``profiler_step``         ``ProfilerStep#12``                                    id
``user.bare``             ``forward``, ``step`` (a bare word, no number/fields)  --
========================  =====================================================  ============================

``user.label`` is the grammar of ``record_function`` labels people write: a head word (``forward``,
``fwd``, ``step``, ``iter``/``iteration``, ``decode``, ``prefill``, ``extend``, ``generate``), an optional
number (``#3``, ``_3``, `` 3``), then free text in which ``decode``/``prefill``/``extend``/``mixed`` give the
mode and ``bs=N`` / ``batch=N`` / ``tokens=N`` / ``toks=N`` / ``tok=N`` the sizes. A bare word that is a
common op name (``step`` alone, ``forward`` alone) is a step too: there is nothing else it could mean as
a user range.

``--steps-from REGEX`` (convert and analyze) replaces the families: every range whose name matches is a
step; named groups ``id``, ``mode``, ``bs``, ``tok`` are used when present, otherwise the same free-text
fields are read from the name.

Modes are upper case: ``DECODE``, ``EXTEND`` (SGLang), ``PREFILL`` (vLLM context, user labels), ``MIXED``,
``IDLE``, ``VERIFY``, ``DRAFT``. A ``DECODE`` step without a token count has ``tokens = bs``.
Everything runs on the distinct range names (a dictionary), never per row.
"""

from __future__ import annotations

import re

import polars as pl

from tracekit._errors import UsageError

__all__ = ["FAMILIES", "MODE_WORDS", "NUMBERED", "choose_family", "compile_steps_from", "label_fields"]

#: family -> regex (named groups as documented above); order = preference
FAMILIES: dict[str, str] = {
    "tk.fwd": r"^tk\.fwd\[(?P<mode>[A-Z_]+)(?: bs=(?P<bs>\d+))?(?: tok=(?P<tok>\d+))?(?P<draft> draft)?[^\]]*\]",
    "sglang.step": r"^step\[(?P<mode>[A-Z_]+)(?: bs=(?P<bs>\d+))?(?: toks=(?P<tok>\d+))?[^\]]*\]",
    "vllm.execute": r"^execute_(?:(?P<tok>\d+)_)?context_(?P<ctx>\d+)\((?P<ctxtok>\d+)?[^)]*\)_generation_(?P<gen>\d+)\(",
    "user.label": (
        r"(?i)^(?:(?P<head>forward|fwd|step|iter|iteration|decode|prefill|extend|generate|model_step|train_step)"
        r"\s*[#_ -]\s*(?P<id>\d+)(?:$|[:\[\( ,;/|].*$)"
        r"|(?P<head2>forward|fwd|step|iter|iteration|decode|prefill|extend|generate|model_step|train_step)[:\[\( ,;/|].+$"
        r"|(?P<head3>decode|prefill|extend|generate)$)"
    ),
    "profiler_step": r"^ProfilerStep#(?P<id>\d+)$",
    "user.bare": r"(?i)^(?P<head>forward|fwd|step|iteration|model_step|train_step)$",
}

#: families whose steps carry their own id (others are numbered in time order); ``user.label`` and
#: ``--steps-from`` ids are used when every step of the rank has one and they are unique
NUMBERED = ("profiler_step",)

#: lower-case words in a label -> mode
MODE_WORDS = {"decode": "DECODE", "prefill": "PREFILL", "extend": "EXTEND", "mixed": "MIXED", "idle": "IDLE",
              "verify": "VERIFY", "draft": "DRAFT", "context": "PREFILL", "generate": "DECODE"}
_MODE_RX = r"(?i)(?:^|[^a-z])(decode|prefill|extend|mixed|idle|verify|draft)(?:$|[^a-z])"
_BS_RX = r"(?i)(?:^|[^a-z])(?:bs|batch|batch_size|nreq|reqs)\s*[=:]\s*(\d+)"
_TOK_RX = r"(?i)(?:^|[^a-z])(?:tokens|toks|tok|ntok|num_tokens|seq|seqlen)\s*[=:]\s*(\d+)"


def compile_steps_from(regex: str | None) -> str | None:
    """Validate a ``--steps-from`` regex (one-line error); returns it unchanged."""
    if regex is None:
        return None
    try:
        rx = re.compile(regex)
    except re.error as e:
        raise UsageError(f"--steps-from: invalid regex {regex!r} ({e}); example: --steps-from '^my_step_\\d+$'") from None
    bad = set(rx.groupindex) - {"id", "mode", "bs", "tok"}
    if bad:
        raise UsageError(f"--steps-from: unknown named group(s) {', '.join(sorted(bad))}; use id, mode, bs, tok")
    return regex


def choose_family(names: pl.Series, steps_from: str | None = None) -> tuple[str, str] | None:
    """``(family, regex)`` of the first family with a match among ``names`` (distinct range names)."""
    if steps_from is not None:
        return ("steps_from", steps_from) if names.str.contains(steps_from).any() else None
    for tag, rx in FAMILIES.items():
        if names.str.contains(rx).any():
            return tag, rx
    return None


def _free_text(text: pl.Expr) -> dict[str, pl.Expr]:
    mode = text.str.extract(_MODE_RX, 1).str.to_lowercase().replace_strict(MODE_WORDS, default=None, return_dtype=pl.String)
    return {
        "mode": mode,
        "bs": text.str.extract(_BS_RX, 1).cast(pl.Int32, strict=False),
        "tok": text.str.extract(_TOK_RX, 1).cast(pl.Int64, strict=False),
    }


def label_fields(names: pl.DataFrame, family: str, rx: str, col: str = "_sn") -> pl.DataFrame:
    """For the names of ``names[col]`` that match ``rx``: ``col, mode, bs, tok, id`` (``id`` only when the
    label carries one; None otherwise). Vectorized over the distinct names."""
    hit = names.filter(pl.col(col).str.contains(rx))
    n = pl.col(col)
    groups = set(re.compile(rx).groupindex)
    g = n.str.extract_groups(rx).struct if groups else None

    def grp(name: str) -> pl.Expr:
        return g.field(name) if g is not None and name in groups else pl.lit(None, dtype=pl.String)

    if family in ("tk.fwd", "sglang.step"):
        mode, bs, tok, sid = grp("mode"), grp("bs").cast(pl.Int32, strict=False), grp("tok").cast(pl.Int64, strict=False), None
    elif family == "vllm.execute":
        ctx = grp("ctx").cast(pl.Int32, strict=False)
        gen = grp("gen").cast(pl.Int32, strict=False)
        mode = (pl.when((ctx > 0) & (gen > 0)).then(pl.lit("MIXED")).when(ctx > 0).then(pl.lit("PREFILL"))
                .when(gen > 0).then(pl.lit("DECODE")).otherwise(pl.lit("IDLE")))
        bs = ctx + gen
        # total scheduled tokens when the label has it; else context tokens (first number in the parentheses) + one per decode
        tok = pl.coalesce(grp("tok").cast(pl.Int64, strict=False),
                          grp("ctxtok").cast(pl.Int64, strict=False).fill_null(0) * (ctx > 0).cast(pl.Int64) + gen.cast(pl.Int64))
        sid = None
    elif family == "profiler_step":
        mode, bs, tok, sid = pl.lit(None, dtype=pl.String), pl.lit(None, dtype=pl.Int32), pl.lit(None, dtype=pl.Int64), grp("id")
    else:  # user.label and --steps-from: explicit groups win, free text fills the rest
        ft = _free_text(n)
        head = pl.coalesce(grp("head"), grp("head2"), grp("head3"))
        head_mode = head.str.to_lowercase().replace_strict(MODE_WORDS, default=None, return_dtype=pl.String)
        mode = pl.coalesce(grp("mode").str.to_uppercase(), ft["mode"], head_mode)
        bs = pl.coalesce(grp("bs").cast(pl.Int32, strict=False), ft["bs"])
        tok = pl.coalesce(grp("tok").cast(pl.Int64, strict=False), ft["tok"])
        sid = grp("id")
    return hit.select(
        col,
        mode.cast(pl.String).alias("mode"),
        bs.cast(pl.Int32).alias("bs"),
        tok.cast(pl.Int64).alias("tok"),
        (sid.cast(pl.Int64, strict=False) if sid is not None else pl.lit(None, dtype=pl.Int64)).alias("id"),
    )
