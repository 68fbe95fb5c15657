"""One IM or webhook channel as configured (Settings.notify_channels): where to post, how to sign, and which
incidents it wants.

Settings holds a list of these (`notify_channels`); `argus.notify.registry.build_channels` turns each into its
platform's Channel. The URL of a Feishu, DingTalk, WeCom or Slack bot is itself a credential (anyone holding it
can post to the group), so it is never logged or written to the delivery log: channels are named by `name`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from core.types import Category, Severity

ChannelKind = Literal["feishu", "dingtalk", "wecom", "slack", "webhook"]

# Platforms whose incoming webhooks have no signing scheme: a secret for them would be silently unused.
UNSIGNED_KINDS = frozenset({"wecom", "slack"})

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ChannelConfig(BaseModel):
    """`kind` picks the payload format; `min_severity` and `categories` filter what the channel is told."""

    # The URL carries the bot's token: kept out of validation errors and repr.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    kind: ChannelKind
    url: str = Field(repr=False, description="the bot's webhook URL (a credential: keep it out of logs and tickets)")
    secret: SecretStr | None = Field(
        default=None, description="signing secret: Feishu/DingTalk 'sign' or the generic webhook's HMAC key"
    )
    name: str = Field(default="", description="how deliveries and logs name this channel; default: the kind")
    min_severity: Severity = Field(default=Severity.INFO, description="incidents below this are not sent here")
    categories: list[Category] = Field(default_factory=list, description="only these categories; empty: all")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip()
        if not v.startswith(("http://", "https://")):
            # The value itself is not echoed: it may hold the bot's access token.
            raise ValueError("must start with http:// or https:// (the bot's webhook URL as the platform gave it)")
        return v

    @model_validator(mode="after")
    def _defaults(self) -> ChannelConfig:
        if not self.name:
            object.__setattr__(self, "name", self.kind)
        if not _NAME.match(self.name):
            raise ValueError(
                f"channel name {self.name[:80]!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a "
                "letter or digit"
            )
        if self.secret is not None and self.kind in UNSIGNED_KINDS:
            raise ValueError(
                f"a {self.kind} webhook has no signing scheme, so its secret would be ignored; remove 'secret' "
                "(the key in the URL is what authenticates)"
            )
        return self

    def wants(self, severity: Severity, category: Category) -> bool:
        if severity.rank < self.min_severity.rank:
            return False
        return not self.categories or category in self.categories
