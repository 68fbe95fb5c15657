"""The channel kinds, in one explicit list, and building them from configuration."""

from __future__ import annotations

from collections.abc import Sequence

from argus.notify.channels import Channel
from argus.notify.dingtalk import DingTalkChannel
from argus.notify.feishu import FeishuChannel
from argus.notify.signed_webhook import SignedWebhookChannel
from argus.notify.slack import SlackChannel
from argus.notify.wecom import WeComChannel
from core.channels import ChannelConfig
from core.errors import ConfigError

CHANNEL_KINDS: dict[str, type[Channel]] = {
    "feishu": FeishuChannel,
    "dingtalk": DingTalkChannel,
    "wecom": WeComChannel,
    "slack": SlackChannel,
    "webhook": SignedWebhookChannel,
}


def build_channels(configs: Sequence[ChannelConfig]) -> list[Channel]:
    """One Channel per config. Names must be unique: deliveries are recorded and deduplicated by name."""
    seen: set[str] = set()
    channels: list[Channel] = []
    for config in configs:
        if config.name in seen:
            raise ConfigError(
                f"two notify channels are named {config.name!r}",
                hint="give each entry of notify_channels its own 'name' (it keys the delivery log)",
            )
        seen.add(config.name)
        channels.append(CHANNEL_KINDS[config.kind](config))
    return channels
