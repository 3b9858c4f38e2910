"""What the published report says about where it was made.

Every string the report prints passes through `Disclosure.text` at render time (Jinja's `finalize`),
so results measured before this existed are covered too:

* always: an absolute path under the working directory becomes relative to it, then one under the
  config's folder relative to that, as the config writes it (`./src` for `python_path: [src]`; a
  project run with `--directory` elsewhere), one under a home folder (`$HOME`, `/home/<user>`,
  `/Users/<user>`) starts with `~`, so a traceback does not give away a user name;
* with `report: {anonymize: true}`: every other absolute path is cut to its last part
  (`…/module.py`), and the host names of the results become `[host]` (the report's provenance and
  the views then name no host).

Our own figures are markup, not text, and are left as drawn: they show knob values and the hardware
the views name, which carries no host once anonymized (`build` drops the summary's host column
before the views draw).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from markupsafe import Markup

# An absolute POSIX path: a slash that does not continue a word, a URL or a relative path, then one
# or more parts.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~/:$\\-])/[\w.+@%~-]+(?:/[\w.+@%~-]+)*/?")
SOMEONES_HOME = re.compile(r"^/(?:home|Users)/[^/]+(?=/|$)")
HOST = "[host]"


def _under(path: str, folder: str) -> bool:
    return folder not in ("", "/") and (path == folder or path.startswith(folder.rstrip("/") + "/"))


@dataclass(frozen=True)
class Disclosure:
    anonymize: bool = False
    cwd: str = field(default_factory=os.getcwd)
    home: str = field(default_factory=lambda: os.path.expanduser("~"))
    hosts: tuple[str, ...] = ()
    config_dir: str | None = None

    @classmethod
    def of(cls, config: dict | None, hosts=(), config_dir: str | None = None) -> "Disclosure":
        """From the config's `report.anonymize`, the host names the results carry and the config's
        folder."""
        anonymize = bool(((config or {}).get("report") or {}).get("anonymize", False))
        names = {str(h) for h in hosts if h is not None and str(h) not in ("", "nan")}
        # a node's short name too
        names |= {h.split(".")[0] for h in names if len(h.split(".")[0]) >= 3}
        return cls(
            anonymize=anonymize,
            hosts=tuple(sorted(names, key=len, reverse=True)),
            config_dir=config_dir,
        )

    def path(self, path: str) -> str:
        """One absolute path as the report shows it."""
        trailing = "/" if path.endswith("/") and len(path) > 1 else ""
        path = path.rstrip("/") or "/"
        if _under(path, self.cwd):
            return (os.path.relpath(path, self.cwd) + trailing) if path != self.cwd else "."
        if self.config_dir and _under(path, self.config_dir):
            inside = os.path.relpath(path, self.config_dir)
            return "./" + (inside + trailing if inside != "." else "")
        if _under(path, self.home):
            return "~" + path[len(self.home.rstrip("/")) :] + trailing
        if SOMEONES_HOME.match(path):
            return SOMEONES_HOME.sub("~", path) + trailing
        if self.anonymize:
            return "…/" + os.path.basename(path) + trailing
        return path + trailing

    def text(self, text: str) -> str:
        """A string for the page: its paths shortened and, when anonymizing, its host names
        withheld."""
        text = ABSOLUTE_PATH.sub(lambda m: self.path(m.group(0)), text)
        if self.anonymize:
            for host in self.hosts:
                text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", HOST, text)
        return text

    def finalize(self, value):
        """Jinja's `finalize`: plain strings are shortened; markup (our checked SVGs) and numbers
        pass as they are."""
        if isinstance(value, str) and not isinstance(value, Markup):
            return self.text(value)
        return value
