"""YAML for files a person or another machine wrote (scenarios, profiles): yaml's safe loader
(no Python objects), plus a bound on what aliases expand to.

Anchors and aliases are fine (`gpu_defaults: &a100`), but nine nested levels of ten aliases each
(the "billion laughs") compose into a few hundred nodes that expand to 10^9 once anything walks
or copies them (the scenario loader deep-copies what it merges): that hangs. The composer here
counts the nodes each alias stands for and refuses a document whose aliases expand to more than
MAX_EXPANDED_NODES, before anything is built. Nodes are not the only measure: one 1 MB string
aliased 3 000 times is 3 001 nodes but 3 GB once written out, so the characters of the scalars the
aliases stand for are bounded too (MAX_EXPANDED_CHARS). Nesting deeper than MAX_DEPTH (PyYAML's
composer recurses once per level: 10 000 `[` would end in RecursionError) is refused as well.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_EXPANDED_NODES = 100_000  # the largest shipped scenario is about 3 000 nodes
MAX_EXPANDED_CHARS = 8_000_000  # scalar characters that aliases add; shipped files are under 100 kB
MAX_DEPTH = 64  # shipped scenarios nest 6 levels


class AliasBomb(yaml.YAMLError):
    """The document's aliases expand to more nodes than any real scenario or profile has."""


class BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._expanded = 0
        self._chars = 0
        self._depth = 0
        self._sizes: dict[int, tuple[int, int]] = {}

    def _size(self, node: yaml.Node) -> tuple[int, int]:
        """(nodes, scalar characters) under `node`, aliases counted as often as they appear
        (memoised, so linear)."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) \
                else node.value
            sizes = [self._size(child) for child in children]
            size = (1 + sum(n for n, _ in sizes), sum(c for _, c in sizes))
        else:
            size = (1, len(str(node.value)))
        self._sizes[id(node)] = size
        return size

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        line = event.start_mark.line + 1
        if self.check_event(yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:
                nodes, chars = self._size(target)
                self._expanded += nodes
                self._chars += chars
                if self._expanded > MAX_EXPANDED_NODES:
                    raise AliasBomb(f"aliases expand to more than {MAX_EXPANDED_NODES} nodes "
                                    f"(line {line}): refused")
                if self._chars > MAX_EXPANDED_CHARS:
                    raise AliasBomb(f"aliases expand to more than {MAX_EXPANDED_CHARS} characters "
                                    f"(line {line}): refused")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise AliasBomb(f"nested deeper than {MAX_DEPTH} levels (line {line}): refused")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(text: str) -> Any:
    """Like yaml.safe_load; raises yaml.YAMLError (AliasBomb included) for what it refuses."""
    return yaml.load(text, Loader=BoundedLoader)
