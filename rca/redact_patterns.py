"""What redaction masks, as data: the default secret patterns (rca/redact.py says how they are written and
matched), the key names that mark a secret in structured data, and the shapes of addresses and user names that
get pseudonyms. Kept apart from the scanning so a new secret shape is a change here only.
"""

from __future__ import annotations

import re

# --- pattern fragments ------------------------------------------------------------------------------------
# Fragments of the case-insensitive patterns are lower case: they run over the lowered copy of the text.

# After a key: an optional closing quote (backslash-escaped in JSON inside a JSON string), then `:` or `=`.
_KEY_END = r"""\\?["']?[ \t]*[:=][ \t]*"""
# Values that say a secret is missing or already hidden, or switch a setting (ssh's `-o PasswordAuthentication=no`);
# they are evidence, not secrets.
_NOT_A_VALUE = r"""(?!\\?["']?(?:none|null|nil|undefined|true|false|yes|no|on|off|enabled|disabled|\*+|x{3,}|<[\w -]{0,40}>|\$\{?\w{1,64}\}?)?\\?["']?(?:[\s,;)\]}&]|$))"""  # noqa: E501
# A value that is code, not data (`api_key = os.environ["X"]`, `token=get_token()` in a traceback).
_NOT_CODE = r"(?![\w.]+[(\[])"


def _value(kind: str, n: int) -> str:
    """A secret value after a key: double-, single- or escaped-quoted (bounded), or a bare word. Quoted values
    are bounded so a value without its closing quote cannot make a match scan the rest of a huge line."""
    return (
        _NOT_A_VALUE + "(?:"
        rf'"(?P<{kind}_{n}>[^"\\\n]{{0,4096}}(?:\\.[^"\\\n]{{0,4096}}){{0,64}})"'
        rf"|'(?P<{kind}_{n + 1}>[^'\\\n]{{0,4096}}(?:\\.[^'\\\n]{{0,4096}}){{0,64}})'"
        rf'|\\"(?P<{kind}_{n + 2}>[^"\\\n]{{1,4096}})\\"'
        rf"""|(?![{{\[]){_NOT_CODE}\\?["']?(?P<{kind}_{n + 3}>[^\s"'&]{{0,8192}}[^\s"'&,;.)\]}}>\\])"""
        ")"
    )


# A value under a key that is only sometimes secret (token, auth): 16+ characters mixing letters and digits.
_TOKEN_VALUE = r"""(?=[a-z0-9_.~+/-]{0,8192}[0-9])(?=[0-9_.~+/-]{0,8192}[a-z])[a-z0-9_.~+/-]{16,8192}=*"""

# Keys whose value is always a secret. Each word heads its own branch: a pattern whose branches all start with a
# literal lets `re` skip ahead in C (one shared group in front of them reads four times slower).
_SECRET_WORDS = (
    "passw(?:or)?d",
    "passphrase",
    "secret",
    "api[ _-]?key",
    "access[ _-]?key",
    "private[ _-]?key",
    "auth[ _-]?key",
    "credential",
    # PWD and OLDPWD hold the shell's working directory: a path there is evidence.
    rf"pwd(?![\w.-]{{0,64}}{_KEY_END}[\"']?[/~])",
)
_KEY_REST = r"[\w.-]{0,64}"  # the rest of the key after the word (AWS_SECRET_ACCESS_KEY, db_password_file)


def _key_value_pattern() -> str:
    branches = [rf"{word}{_KEY_REST}{_KEY_END}{_value('secret', 4 * i)}" for i, word in enumerate(_SECRET_WORDS)]
    # `pass` as the whole last word of a key (DB_PASS=, pass:), not pass_rate / pass@1 / bypass.
    branches.append(rf"pass(?<![a-z]pass){_KEY_END}{_value('secret', 4 * len(_SECRET_WORDS))}")
    # A key ending in token or auth (HF_TOKEN, access_token, x-auth-token, oauth) holds a secret only when the
    # value looks like one: max_tokens=512, pad_token: <|endoftext|>, tokenizer=... stay.
    # (The lookahead names what may follow the word, so the gate skips tokens, tokenizer, token_ids...)
    branches.append(rf"""token(?=[\\"' \t:=]){_KEY_END}\\?["']?(?P<token>{_TOKEN_VALUE})""")
    branches.append(rf"""auth(?=[\\"' \t:=]){_KEY_END}\\?["']?(?P<token_1>{_TOKEN_VALUE})""")
    return "(?i)" + "|".join(branches)


def _flag_pattern() -> str:
    """`--password hunter2`, `--api-key sk-...`, `--hf-token hf_...`: a flag whose value follows a space."""
    words = "|".join((*_SECRET_WORDS[:-1], "pwd", r"pass(?![\w.-])"))
    return (
        r"(?i)--(?<![\w-]--)(?=[a-z])"
        rf"(?:[\w.-]{{0,64}}?(?:{words}){_KEY_REST}[ \t]+(?![-\s]){_value('secret', 0)}"
        rf"""|[\w.-]{{0,64}}?(?:token|auth)[ \t]+\\?["']?(?P<token>{_TOKEN_VALUE}))"""
    )


_PEM_LABEL = r"(?:[A-Z0-9]{1,16} ){0,4}PRIVATE KEY(?: BLOCK)?-----"

# (name, regex). Order matters only for naming: where spans of several patterns overlap, the merged span is
# named after the pattern listed first, so provider shapes come before the generic key=value rule.
DEFAULT_PATTERNS: list[tuple[str, str]] = [
    # A whole PEM block, also with JSON's escaped newlines; a block cut before its END line is masked to the end
    # of its base64 run.
    (
        "private_key",
        rf"-----BEGIN {_PEM_LABEL}"
        rf"(?:[^-]{{0,32768}}(?:-(?!----)[^-]{{0,32768}}){{0,16}}-----END {_PEM_LABEL}"
        r"|[A-Za-z0-9+/=\s:,\\]{0,65536})",
    ),
    # Provider token shapes. Each starts with its literal prefix, then checks (looking back) that the prefix
    # starts a word: `task-`, `disk-`, `hf_hub_download`, `AKIAI` inside a longer word do not match.
    ("anthropic_api_key", r"sk-ant-(?<![\w-]sk-ant-)[A-Za-z0-9_-]{20,}"),
    ("openai_api_key", r"sk-(?<![\w-]sk-)(?=[A-Za-z_-]{0,256}[0-9])[A-Za-z0-9_-]{20,}"),
    ("huggingface_token", r"hf_(?<![\w]hf_)[A-Za-z0-9]{30,}"),
    ("github_token", r"g(?:h[pousr]_(?<![\w]gh._)[A-Za-z0-9]{36,}|ithub_pat_(?<![\w]github_pat_)[A-Za-z0-9_]{22,})"),
    ("gitlab_token", r"glpat-(?<![\w-]glpat-)[A-Za-z0-9_-]{20,}"),
    ("slack_token", r"x(?:ox[abcdeoprs]-(?<![\w-]xox.-)[A-Za-z0-9-]{10,}|app-(?<![\w-]xapp-)[0-9]-[A-Za-z0-9-]{10,})"),
    ("aws_access_key", r"A[KS]IA(?<![A-Za-z0-9]A[KS]IA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("google_api_key", r"AIza(?<![\w-]AIza)[A-Za-z0-9_-]{35,}"),
    # Alibaba Cloud AccessKey ids and Tencent Cloud SecretIds (what OSS / COS checkpoint uploads log)
    ("aliyun_access_key", r"LTAI(?<![A-Za-z0-9]LTAI)[A-Za-z0-9]{12,20}(?![A-Za-z0-9])"),
    ("tencent_secret_id", r"AKID(?<![A-Za-z0-9]AKID)[A-Za-z0-9]{32,36}(?![A-Za-z0-9])"),
    ("jwt", r"eyJ(?<![\w-]eyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
    # Argus API tokens: `argus_<8 hex>` is the public id (kept, it names the token); the rest is the secret.
    ("argus_token", r"argus_(?<![\w]argus_)[0-9a-f]{8}_(?P<argus_token>[A-Za-z0-9_-]{43})"),
    (
        "wandb_api_key",
        r"wandb(?: login(?:[ \t]+--?[a-z-]{1,32}(?:=\S{1,256})?){0,4}[ \t]+(?P<wandb_api_key>[A-Za-z0-9_-]{20,})"
        r"""|\.login\([^()]{0,256}?key[ \t]*=[ \t]*["'](?P<wandb_api_key_1>[^"'\s]+)["'])""",
    ),
    # IM webhooks: the URL's secret part (what the 2025 issue threads tell people to paste alone).
    ("feishu_webhook", r"open-apis/bot/v2/hook/(?P<feishu_webhook>[A-Za-z0-9-]{8,})"),
    ("dingtalk_webhook", r"robot/send(?:BySession)?\?(?:access_token|session)=(?P<dingtalk_webhook>[A-Za-z0-9_-]+)"),
    ("wecom_webhook", r"webhook/send\?key=(?P<wecom_webhook>[A-Za-z0-9_-]+)"),
    ("slack_webhook", r"hooks\.slack\.com/services/(?P<slack_webhook>[A-Za-z0-9_/-]+)"),
    (
        "discord_webhook",
        r"/api/webhooks/(?:(?<=discord\.com/api/webhooks/)|(?<=discordapp\.com/api/webhooks/))"
        r"(?P<discord_webhook>[0-9]+/[A-Za-z0-9_-]+)",
    ),
    # scheme://user:password@host keeps scheme, user and host; scheme://<token>@host masks the token. The
    # password runs to the last @ before the host (an unencoded @ in a password is common).
    (
        "url_password",
        r"""://(?:(?P<_user>[^\s/:@"'<>]{0,256}):(?!\*+@|\$\{?\w{1,64}\}?@)(?P<url_password>[^\s/"'<>]{1,1024})"""
        r"""@(?![^\s/"'<>]{0,1024}@)|(?P<url_password_1>[A-Za-z0-9_-]{20,256})@)""",
    ),
    # Authorization headers keep their scheme (Bearer, Basic...) and mask the rest of the value.
    (
        "authorization",
        rf"""(?i)authorization{_KEY_END}\\?["']?"""
        r"(?:(?:bearer|basic|token|digest|negotiate|ntlm|apikey|api-key|key|sso-key|aws4-hmac-sha256)[ \t]+)?"
        r"""(?!(?:none|null|undefined|\*+|bearer|basic|token|digest)?\\?["']?(?:[\s,;)\]}]|$))"""
        r"""(?P<authorization>[^\r\n"'\\]{0,8192}[^\s"',;\\])""",
    ),
    (
        "bearer_token",
        r"(?i)bearer(?<![a-z0-9]bearer)[ \t]+(?P<bearer_token>(?=[a-z0-9._~+/-]{0,8192}[0-9])[a-z0-9._~+/-]{8,}=*)",
    ),
    (
        "cookie",
        r"""(?i)cookie\\?["']?[ \t]*:[ \t]*\\?["']?(?!(?:none|null)?\\?["']?(?:[\s,;)\]}]|$))"""
        r"""(?P<cookie>[^\r\n"'\\]{0,8192}[^\s"',;\\])""",
    ),
    ("secret", _key_value_pattern()),
    ("secret_flag", _flag_pattern()),
    # .netrc (what `wandb login` writes): machine <host> login <user> password <secret>
    (
        "netrc_password",
        r"(?i)machine[ \t]+\S{1,256}\s{1,64}login[ \t]+\S{1,256}\s{1,64}password[ \t]+(?P<password>\S+)",
    ),
    ("sshpass", r"sshpass[ \t]+-p[ \t]*(?P<password>\S+)"),
    # curl -u user:password (not `docker -u 1000:1000`, whose second half is a group id)
    (
        "basic_auth",
        r"""(?:-u(?<!\S-u)|--user(?<!\S--user))[ \t]+(?P<_user>[^\s:'"]{1,256}):(?![0-9]+(?:\s|$))"""
        r"""(?P<password>[^\s'"]+)""",
    ),
    # Signed URLs and webhook bodies (DingTalk sign=, S3 X-Amz-Signature=, Feishu "sign": "...")
    (
        "signature",
        r"""(?i)\?(?:sign|sig|signature|x-amz-signature)=(?P<signature>[^\s&"'#]+)"""
        r"""|&(?:sign|sig|signature|x-amz-signature)=(?P<signature_1>[^\s&"'#]+)"""
        r'|"sign"[ \t]*:[ \t]*"(?P<signature_2>[^"\\\n]{1,4096})"',
    ),
]

# --- keys of structured data (redact_data) ---------------------------------------------------------------

SECRET_KEY = re.compile(
    r"passw(?:or)?d|passphrase|secret|api[ _-]?key|access[ _-]?key|private[ _-]?key|auth[ _-]?key|credential"
    r"|(?<![a-z])pass$|pwd"
)
HEADER_KEY = re.compile(r"authorization|cookie")
TOKEN_KEY = re.compile(r"(?:token|auth)$")
LOOKS_SECRET = re.compile(r"(?=[A-Za-z0-9_.~+/-]*[0-9])(?=[0-9_.~+/-]*[A-Za-z])[A-Za-z0-9_.~+/-]{16,}=*")

# --- pseudonyms -------------------------------------------------------------------------------------------

IPV4 = re.compile(r"[0-9](?<![\w.][0-9])[0-9]{0,2}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?!\w|\.[0-9])")
# The first dot of something shaped like an address: a scan that stops at dots reads four times faster than
# one that stops at every digit.
IPV4_DOT = re.compile(r"\.(?<=[0-9]\.)(?=[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?![0-9]))")
# Runs over the lowered text. Only runs of hex and colons that start a word, hold `::` or eight groups, two
# groups at least (not `a::`, not C++'s `c10d::`), and end a word; ipaddress decides.
IPV6 = re.compile(
    r"[0-9a-f:](?<![\w:.%][0-9a-f:])(?=[0-9a-f:]{0,38}::|(?:[0-9a-f]{1,4}:){7}[0-9a-f])"
    r"(?=[0-9a-f:]{0,36}[0-9a-f]:{1,2}[0-9a-f])[0-9a-f:]{2,39}"
    r"(?:%[0-9a-z_.-]{1,16})?(?![\w:%]|\.\w)"
)
# Where an IPv6 address may be: every `::`, and the first colon of eight groups. Scans that stop only there read
# ten times faster than one that stops at every hex digit; the address's start is found by looking back.
IPV6_SEEDS = re.compile(r"::|:(?<=[0-9a-f]:)(?=[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){6}(?![0-9a-f:]))")
HEX_OR_COLON = frozenset("0123456789abcdef:")
# /home/<user>/, /home/users/<user>/, /Users/<user>/ and the shared store's users/<user>/ (lowered text)
USER_PATH = re.compile(r"/(?:home/(?:users/)?|users/)(?P<user>[a-z0-9_][a-z0-9._-]{0,63})(?=[/\s\"':;,)\]}]|$)")
