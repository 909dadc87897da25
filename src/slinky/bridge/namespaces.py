"""Which namespaces are the bridge's: the config's list, or its `managedNamespaceSelector`
over the namespaces' labels; never kube-system or the bridge's own namespace. The webhook
and the scheduler ask the same question, so a pod the webhook would not have touched is
not scheduled either (naming the bridge's scheduler does not make a namespace managed)."""

from __future__ import annotations

from slinky.bridge.config import NEVER_MANAGED, BridgeConfig
from slinky.kube import rest
from slinky.kube.informer import Informer, InformerFactory


class ManagedNamespaces:
    def __init__(
        self, kube: rest.Kube, factory: InformerFactory, config: BridgeConfig, own: str
    ) -> None:
        self.kube = kube
        self.config = config
        self.own = own
        # Namespace labels are needed only to evaluate managedNamespaceSelector.
        self.informer: Informer | None = None
        if config.managed_namespace_selector is not None:
            self.informer = factory.informer(rest.NAMESPACES)

    @property
    def has_synced(self) -> bool:
        return self.informer is None or self.informer.has_synced

    async def managed(self, namespace: str) -> bool:
        """Whether pods of `namespace` are the bridge's."""
        if not namespace or namespace in NEVER_MANAGED or namespace == self.own:
            return False
        if self.informer is None:
            return self.config.is_managed_namespace(namespace, None)
        obj = self.informer.store.get(namespace)
        if obj is None:  # created a moment ago and not yet in the cache
            try:
                obj = await self.kube.get(rest.NAMESPACES, namespace)
            except rest.ApiError as e:
                if e.not_found:
                    return False
                raise
        return self.config.is_managed_namespace(namespace, obj["metadata"].get("labels"))
