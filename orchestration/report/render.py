"""The report as a document: blocks rendered twice, as Markdown (plots beside it) and as one self-contained HTML
page (plots embedded), and the number formats every table uses."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path


class Doc:
    """Blocks rendered twice: Markdown (plots beside it) and self-contained HTML (plots embedded)."""

    def __init__(self, title: str):
        self.title, self.blocks = title, []

    def h(self, level: int, text: str):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def items(self, lines: list[str]):
        if lines:
            self.blocks.append(("ul", lines))

    def table(self, head: list[str], rows: list[list]):
        if rows:
            self.blocks.append(("table", head, [[cell(c) for c in r] for r in rows]))

    def img(self, path: Path, alt: str):
        if path.exists():
            self.blocks.append(("img", path, alt))

    def markdown(self, root: Path) -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            if b[0] == "h":
                out += ["#" * b[1] + " " + b[2], ""]
            elif b[0] == "p":
                out += [b[1], ""]
            elif b[0] == "ul":
                out += [f"- {x}" for x in b[1]] + [""]
            elif b[0] == "table":
                out += ["| " + " | ".join(b[1]) + " |", "|" + "---|" * len(b[1])]
                out += ["| " + " | ".join(r) + " |" for r in b[2]] + [""]
            elif b[0] == "img":
                out += [f"![{b[2]}]({b[1].relative_to(root).as_posix()})", ""]
        return "\n".join(out)

    def html(self) -> str:
        def inline(t: str) -> str:  # the Markdown we write: **bold** and `code`
            t = html.escape(t)
            parts = t.split("**")
            t = "".join(f"<strong>{x}</strong>" if i % 2 else x for i, x in enumerate(parts))
            parts = t.split("`")
            return "".join(f"<code>{x}</code>" if i % 2 else x for i, x in enumerate(parts))

        body = [f"<h1>{html.escape(self.title)}</h1>"]
        for b in self.blocks:
            if b[0] == "h":
                body.append(f"<h{b[1]}>{inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                body.append(f"<p>{inline(b[1])}</p>")
            elif b[0] == "ul":
                body.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in b[1]) + "</ul>")
            elif b[0] == "table":
                head = "".join(f"<th>{inline(x)}</th>" for x in b[1])
                rows = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in b[2])
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif b[0] == "img":
                data = base64.b64encode(b[1].read_bytes()).decode()
                body.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{inline(b[2])}</figcaption></figure>")
        style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
                 "table{border-collapse:collapse;margin:1em 0;font-size:.9em}td,th{border:1px solid #ccc;"
                 "padding:.25em .6em;text-align:left}th{background:#f3f3f3}img{max-width:100%}"
                 "figure{margin:1em 0}figcaption{font-size:.85em;color:#555}code{background:#f3f3f3}")
        return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(self.title)}</title>"
                f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def cell(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def fmt_ci(ci) -> str:
    return "—" if not ci else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def fmt_ratio(r) -> str:
    return f"{r:g}"


def fmt_p(p) -> str:
    return "—" if p is None else (f"{p:.2g}" if p >= 1e-3 else "<0.001")
