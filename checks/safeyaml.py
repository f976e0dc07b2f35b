"""YAML for files a person or another machine wrote (scenarios, profiles): yaml's safe loader
(no Python objects), plus a bound on what aliases expand to.

Anchors and aliases are fine (`gpu_defaults: &a100`), but nine nested levels of ten aliases each
(the "billion laughs") compose into a few hundred nodes that expand to 10^9 once anything walks
or copies them (the scenario loader deep-copies what it merges): that hangs. The composer here
counts the nodes each alias stands for and refuses a document whose aliases expand to more than
MAX_EXPANDED_NODES, before anything is built.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_EXPANDED_NODES = 100_000  # the largest shipped scenario is about 3 000 nodes


class AliasBomb(yaml.YAMLError):
    """The document's aliases expand to more nodes than any real scenario or profile has."""


class BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._expanded = 0
        self._sizes: dict[int, int] = {}

    def _size(self, node: yaml.Node) -> int:
        """Nodes under `node`, aliases counted as often as they appear (memoised, so linear)."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
        else:
            size = 1
        self._sizes[id(node)] = size
        return size

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                self._expanded += self._size(target)
                if self._expanded > MAX_EXPANDED_NODES:
                    raise AliasBomb(f"aliases expand to more than {MAX_EXPANDED_NODES} nodes "
                                    f"(line {event.start_mark.line + 1}): refused")
        return super().compose_node(parent, index)


def load(text: str) -> Any:
    """Like yaml.safe_load; raises yaml.YAMLError (AliasBomb included) for what it refuses."""
    return yaml.load(text, Loader=BoundedLoader)
