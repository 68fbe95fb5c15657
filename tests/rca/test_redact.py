"""Redaction: every default pattern on real line shapes, near misses that must stay byte-identical, hostile input,
pseudonyms, nested data and configuration errors.

Log lines are copied from public issue threads (each case names its source, repo#number). Threads never show a
live secret: where a line held one (written as xxx, *** or <token>), a made-up value of the provider's documented
shape is put back. Those values are built at run time (`fake`), so no token-shaped literal sits in this file for
a secret scanner to flag. Cases marked "shape" have no thread behind them: the line is the documented format.

One file past 400 lines on purpose: most of it is the table of real line shapes, one case per pattern.
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path

import pytest

from core.errors import ConfigError, InputError
from rca.redact import MAX_DEPTH, Redactor
from rca.redact_scan import lower_ascii
from tests.cost import assert_bounded, assert_linear

TESTS = Path(__file__).resolve().parents[1]
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


def fake(prefix: str, alphabet: str, n: int, seed: str = "") -> str:
    rng = random.Random(prefix + seed)
    return prefix + "".join(rng.choice(alphabet) for _ in range(n))


def b64url(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def jwt() -> str:
    claims = {"nbf": 1501662145, "exp": 1501665745, "iss": "http://localhost:55742", "client_id": "cixForumsDev"}
    return f"{b64url({'alg': 'RS256', 'typ': 'JWT'})}.{b64url(claims)}.{fake('', ALNUM + '-_', 342)}"


PEM_BODY = "\n".join(fake("MII", ALNUM + "+/", 61, str(i)) for i in range(6))
UUID_LIKE = "3fa85f64-5717-4562-b3fc-2c963f66afa6"

# (id, line, secret in the line, kind it must be masked as). The expected output is the line with the secret
# replaced by [REDACTED:<kind>] and nothing else changed.
POSITIVES = [
    # --- PEM private keys (shape: RFC 7468; Google service-account JSON)
    (
        "pem_block",
        f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----",
        f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----",
        "private_key",
    ),
    (
        "pem_openssh",
        f"key:\n-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----\nok",
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----",
        "private_key",
    ),
    (
        "pem_in_json",
        '  "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n'
        '-----END PRIVATE KEY-----\\n",',
        "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----\\n",
        "private_key",
    ),
    (
        "pem_cut",
        f"-----BEGIN EC PRIVATE KEY-----\n{PEM_BODY}",
        f"-----BEGIN EC PRIVATE KEY-----\n{PEM_BODY}",
        "private_key",
    ),
    # --- provider token shapes
    (
        "openai_env",
        "export OPENAI_API_KEY=" + fake("sk-", ALNUM, 48),  # chenfei-wu/TaskMatrix#183 (sk-xxxx)
        fake("sk-", ALNUM, 48),
        "openai_api_key",
    ),
    (
        "openai_proj",
        "client = OpenAI(api_key='" + fake("sk-proj-", ALNUM + "_-", 120) + "')",  # shape
        fake("sk-proj-", ALNUM + "_-", 120),
        "openai_api_key",
    ),
    (
        "anthropic",
        "ANTHROPIC_API_KEY=" + fake("sk-ant-api03-", ALNUM + "_-", 95),
        fake("sk-ant-api03-", ALNUM + "_-", 95),
        "anthropic_api_key",
    ),  # shape
    (
        "hf_env",
        "export HF_TOKEN=" + fake("hf_", string.ascii_letters, 34),
        fake("hf_", string.ascii_letters, 34),
        "huggingface_token",
    ),  # huggingface/huggingface_hub#2765 (echo $HF_TOKEN)
    (
        "github_clone",
        f"git clone https://oauth2:{fake('ghp_', ALNUM, 36)}@try.gogs.io/username/reponame.git",
        fake("ghp_", ALNUM, 36),
        "github_token",
    ),  # gogs/gogs#6391 (ACCESS_TOKEN)
    (
        "github_pat",
        f"remote: https://oauth2:{fake('github_pat_', ALNUM + '_', 82)}@github.com/org/repo",
        fake("github_pat_", ALNUM + "_", 82),
        "github_token",
    ),  # sourcegraph/sourcegraph-public-snapshot#45136
    (
        "gitlab",
        f"git clone -b develop  https://gitlab+deploy-token-497024:{fake('glpat-', ALNUM, 20)}@gitlab.com/p/x.git",
        fake("glpat-", ALNUM, 20),
        "gitlab_token",
    ),  # piyushsachdeva/GitLabCITutorial#1 ($TOKEN)
    (
        "slack_env",
        "SLACK_BOT_TOKEN=" + fake("xoxb-", string.digits, 12) + "-" + fake("", ALNUM, 24),
        fake("xoxb-", string.digits, 12) + "-" + fake("", ALNUM, 24),
        "slack_token",
    ),  # shape
    (
        "aws_key_id",
        "AWS_ACCESS_KEY_ID=" + fake("AKIA", string.ascii_uppercase + string.digits, 16),
        fake("AKIA", string.ascii_uppercase + string.digits, 16),
        "aws_access_key",
    ),  # boto/boto3#2815 (shape)
    (
        "aws_sts",
        "credentials: " + fake("ASIA", string.ascii_uppercase + string.digits, 16) + " expires 12:00",
        fake("ASIA", string.ascii_uppercase + string.digits, 16),
        "aws_access_key",
    ),  # shape
    (
        "google",
        "Error fetching from https://generativelanguage.googleapis.com/v1/models/gemini-pro:streamGenerate"
        f"Content?key={fake('AIza', ALNUM + '_-', 35)}&alt=sse: [400 Bad Request]",  # Jazee6/cloudflare-ai-web#13
        fake("AIza", ALNUM + "_-", 35),
        "google_api_key",
    ),
    (
        "jwt",
        f'2017-08-02T10:27:28.9641697+01:00 0HL6PFUCMUMHG [INF] Failed to validate the token "{jwt()}". (f3081a27)',
        jwt(),
        "jwt",
    ),  # DuendeArchive/IdentityServer4#1384
    (
        "wandb_login",
        "wandb login fcsaddbkj54as1cs4a17dea6b984dc53472cd959db60",  # wandb/wandb#2878, as posted
        "fcsaddbkj54as1cs4a17dea6b984dc53472cd959db60",
        "wandb_api_key",
    ),
    ("wandb_relogin", "wandb login --relogin " + fake("", HEX, 40), fake("", HEX, 40), "wandb_api_key"),  # wandb#4139
    (
        "wandb_login_py",
        'wandb.login(key="' + fake("", HEX, 40, "py") + '")',
        fake("", HEX, 40, "py"),
        "wandb_api_key",
    ),  # wandb/wandb#11411
    (
        "aliyun",
        "oss2.Auth('" + fake("LTAI", ALNUM, 20) + "', secret) -> 403 InvalidAccessKeyId",
        fake("LTAI", ALNUM, 20),
        "aliyun_access_key",
    ),  # shape
    (
        "tencent",
        "CosServiceError: SecretId=" + fake("AKID", ALNUM, 32) + " is invalid",
        fake("AKID", ALNUM, 32),
        "tencent_secret_id",
    ),  # shape
    # --- IM webhooks
    (
        "feishu",
        f"[08:30:42.920] [push.py 606] [ERROR]: 飞书机器人推送失败！ https://open.feishu.cn/open-apis/bot/v2/hook/{UUID_LIKE}",
        UUID_LIKE,
        "feishu_webhook",
    ),  # shape of ZenlessZoneZero-OneDragon#923's log line, URL of whyour/qinglong#1745 (xxx)
    (
        "dingtalk_session",
        '"sessionWebhook":"https://oapi.dingtalk.com/robot/sendBySession?session=f41dd76d7c81d3ab81be3617087ec47c",'
        '"text":{"content":"\\xe4\\xbd\\xa0\\xe6\\x98\\xaf"},"robotCode":"dingwjbmfyoxjs27qbwo","msgtype":"text"}',
        "f41dd76d7c81d3ab81be3617087ec47c",
        "dingtalk_webhook",
    ),  # zhayujie/bot-on-anything#274, as posted (an expired session)
    (
        "wecom",
        f"Sent to QYWX WebHook: https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={UUID_LIKE}",
        UUID_LIKE,
        "wecom_webhook",
    ),  # qd-today/qd#586
    (
        "slack_webhook",
        "POST https://hooks.slack.com/services/T0000/B0000/" + fake("", ALNUM, 24) + " 404",
        "T0000/B0000/" + fake("", ALNUM, 24),
        "slack_webhook",
    ),  # shape
    (
        "discord_webhook",
        "https://discord.com/api/webhooks/1234567890/" + fake("", ALNUM + "_-", 68),
        "1234567890/" + fake("", ALNUM + "_-", 68),
        "discord_webhook",
    ),  # shape
    (
        "sign_param",
        "POST https://oapi.dingtalk.com/robot/send?timestamp=1700000000000&sign=ZTc5YjE5ODA%2BZjRm%3D -> 310000",
        "ZTc5YjE5ODA%2BZjRm%3D",
        "signature",
    ),  # shape (DingTalk signed robot)
    (
        "feishu_sign",
        '{"timestamp": "1599360473", "sign": "xxxxxxxxxxxxxxxxxxxxxxx=", "msg_type": "text"}',
        "xxxxxxxxxxxxxxxxxxxxxxx=",
        "signature",
    ),  # shape (Feishu signed bot body)
    (
        "s3_presigned",
        "GET /bucket/ckpt.pt?X-Amz-Expires=3600&X-Amz-Signature=" + fake("", HEX, 64) + " 403",
        fake("", HEX, 64),
        "signature",
    ),  # shape
    # --- URLs with credentials: scheme, user and host stay
    (
        "dsn",
        "Engine(postgresql+psycopg2://DUMB:s3cr3t-pw@127.0.0.1/riven)",
        "s3cr3t-pw",
        "url_password",
    ),  # I-am-PUID-0/DUMB#86
    ("dsn_at_in_password", "redis://:p@ss@10.0.0.5:6379/0 refused", "p@ss", "url_password"),  # shape
    (
        "clone_placeholder",
        "git clone https://oauth2:ACCESS_TOKEN@try.gogs.io/username/reponame.git",
        "ACCESS_TOKEN",
        "url_password",
    ),  # gogs/gogs#6391, as posted
    # --- headers
    (
        "bearer_header",
        "Authorization: Bearer sk-xxxxx-Gww  ",
        "sk-xxxxx-Gww",
        "authorization",
    ),  # continuedev/continue#6859
    ("basic_header", "> Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA==", "authorization"),  # shape
    (
        "header_dict",
        "headers={'Authorization': 'Bearer 8f14e45fceea167a5a36', 'Accept': '*/*'}",
        "8f14e45fceea167a5a36",
        "authorization",
    ),  # shape (requests debug)
    ("slack_header", "Authorization: Bearer xoxb-some-token", "xoxb-some-token", "slack_token"),  # Elixir-Slack#261
    ("bearer_alone", "X-Forwarded-Access-Token: Bearer ab12cd34ef56gh78", "ab12cd34ef56gh78", "bearer_token"),  # shape
    ("cookie", "  -H 'cookie: d=xoxd-xxxx' \\", "d=xoxd-xxxx", "cookie"),  # emtunc/SlackPirate#61
    # --- key = value, in every form
    ("env_digits", "WANDB_API_KEY=1234567890", "1234567890", "secret"),  # CHTC/templates-GPUs#28
    ("env_secret", "AWS_SECRET_ACCESS_KEY=" + fake("", ALNUM + "+/", 40), fake("", ALNUM + "+/", 40), "secret"),
    (
        "ini",
        "aws_secret_access_key = " + fake("", ALNUM + "+/", 40, "ini"),
        fake("", ALNUM + "+/", 40, "ini"),
        "secret",
    ),  # boto/boto3#2532 (~/.aws/credentials)
    ("json", '{"username": "ray", "password": "hunter2!", "port": 5432}', "hunter2!", "secret"),  # shape
    ("json_escaped_quote", '{"password": "pa\\"ss word", "user": "x"}', 'pa\\"ss word', "secret"),  # shape
    ("json_in_json", '{"body": "{\\"api_key\\": \\"abc123def\\"}"}', "abc123def", "secret"),  # shape
    ("yaml", "  db_password: Tr0ub4dor&3", "Tr0ub4dor", "secret"),  # shape (value stops at &)
    ("python_repr", "Namespace(model='qwen', api_key='k-123456', seed=1)", "k-123456", "secret"),  # shape
    ("header_api_key", "x-api-key: 0123456789abcdef", "0123456789abcdef", "secret"),  # shape
    (
        "query_secret",
        "POST /oauth/token?client_secret=" + fake("", ALNUM, 32) + "&grant_type=client_credentials",
        fake("", ALNUM, 32),
        "secret",
    ),  # shape
    ("db_pass", "DB_PASS=s3cret", "s3cret", "secret"),  # shape
    ("credential", 'credential: "AKIDz8krbsJ5yKBZQpn74WFkmLPx3"', "AKIDz8krbsJ5yKBZQpn74WFkmLPx3", "secret"),  # shape
    ("token_hex", "access_token=" + fake("", HEX, 64), fake("", HEX, 64), "token"),  # shape (DingTalk robot)
    ("token_json", '{"auth_token": "' + fake("", ALNUM, 32) + '"}', fake("", ALNUM, 32), "token"),  # shape
    ("token_yaml", "  hf_token: " + fake("", ALNUM, 24), fake("", ALNUM, 24), "token"),  # shape
    # --- command lines
    (
        "flag_api_key",
        "vllm serve Qwen/Qwen3-8B --port 4015 --api-key tok-8f14e45fceea --max_num_seqs=64",
        "tok-8f14e45fceea",
        "secret",
    ),  # vllm-project/vllm#18893 (VLLM_API_KEY=****)
    (
        "flag_token",
        "python train.py --hf-token " + fake("", ALNUM, 20, "flag") + " --epochs 3",
        fake("", ALNUM, 20, "flag"),
        "token",
    ),  # shape
    ("sshpass", "sshpass -p 'Pa55word' ssh root@node-3 nvidia-smi", "'Pa55word'", "password"),  # shape
    ("curl_user", "curl -u admin:Pa55word http://10.0.0.5:9093/api/v2/alerts", "Pa55word", "password"),  # shape
    (
        "netrc",
        "machine api.wandb.ai\n  login user\n  password " + fake("", HEX, 40, "netrc"),
        fake("", HEX, 40, "netrc"),
        "password",
    ),  # wandb/wandb#26 (~/.netrc)
    # --- Argus' own API tokens: the public id stays
    (
        "argus_token",
        "token argus_1a2b3c4d_" + fake("", ALNUM + "_-", 43) + " created for ops-agent",
        fake("", ALNUM + "_-", 43),
        "argus_token",
    ),  # shape (argus/store/tokens.py)
]

# Real lines that must come out byte-identical: counted tokens, tokenizers, ids, UUIDs, addresses, masked or
# missing secrets (evidence), near misses of every shape.
NEGATIVES = [
    # DeepSpeed's launcher checking ssh (tests/rca_cases/486): a setting switched off, not a password
    "subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no 192.168.3.100 hostname' returned "
    "non-zero exit status 255.",
    # verl-project/verl#1208
    "(TaskRunner pid=16292) step:2 - global_seqlen/min:538646.000 - actor/kl_loss:0.001 - actor/pg_loss:0.001 - "
    "response_length/mean:324.958 - prompt_length/clip_ratio:0.000 - timing_s/gen:74.020 - timing_s/step:96.551 - "
    "timing_per_token_ms/adv:0.001 - timing_per_token_ms/ref:",
    # verl-project/verl#7412 (cut as posted)
    "timing_s/agent_loop/slowest/prompt_length:150 - timing_per_token_ms/gen:0.35941479941160787 - perf/total_num_t",
    # verl-project/verl#438
    "ppo_max_token_len_per_gpu=$(( (max_prompt_length + max_response_length)* 2 ))",
    "echo ppo_max_token_len_per_gpu=$ppo_max_token_len_per_gpu",
    "export WANDB_API_KEY=xxx",
    # vllm-project/vllm#1031
    "sampling_parameters: top_p=0.9, temperature=0.3,max_tokens=1024",
    # hiyouga/LlamaFactory#9189
    "The tokenizer has new PAD/BOS/EOS tokens that differ from the model config and generation config. Updated "
    "tokens: {'eos_token_id': 151645, 'bos_token_id': None, 'pad_token_id': 151643}.",
    # QwenLM/Qwen#500
    '  "eos_token": "<|endoftext|>",',
    '  "pad_token": "<|extra_0|>",',
    '  "tokenizer_class": "QWenTokenizer",',
    '  "tokenizer_file": null',
    # gpustack/gpustack#2732
    "INFO 08-14 09:31:16 [serving_chat.py:125] Using default chat sampling params from model: {'temperature': 0.7, "
    "'top_k': 20, 'top_p': 0.8}",
    "INFO 08-14 09:31:16 [api_server.py:1457] Starting vLLM API server 0 on http://0.0.0.0:40052",
    # vllm-project/vllm#18893
    "INFO 05-29 16:17:29 [launcher.py:36] Route: /tokenize, Methods: POST",
    'vllm serve "$model_name" --host 0.0.0.0 --port 4015 -tp=4 \\',
    "export VLLM_API_KEY=****",
    # vllm-project/vllm#22407
    '(APIServer pid=3999075) INFO:     127.0.0.1:46686 - "GET /v1/chat/completions HTTP/1.1" 401 Unauthorized',
    # vllm-project/vllm#33412: `vllm bench` sent this header when OPENAI_API_KEY was unset, the root cause
    "Authorization: Bearer None",
    "TORCHINDUCTOR_CACHE_DIR=/tmp/cache/torchinductor_root",
    # influxdata/telegraf#5812
    "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)",
    "  MIG 1g.20gb     Device  0: (UUID: MIG-ce861fb0-a248-58ce-a9a8-f9adbc22a66a)",
    # NVIDIA/CUDALibrarySamples#104
    "    GPU UUID                              : GPU-a75cda02-62ce-2c30-9150-555ef08935e2",
    # popjane/free_chatgpt_api#3: OpenAI masked the key itself
    "openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Incorrect API key provided: sk-PMafP"
    + "*" * 39
    + "E873. You can find your API key at https://platform.openai.com/account/api-keys.', 'type': 'invalid_request_"
    "error', 'param': None, 'code': 'invalid_api_key'}}",
    # continuedev/continue#9634
    "401 Incorrect API key provided: sk-proj-" + "*" * 160 + "MxYA. You can find your API key at "
    "https://platform.openai.com/account/api-keys.",
    # hiyouga/EasyR1#69
    "wandb.errors.errors.UsageError: api_key not configured (no-tty). call wandb.login(key=[your_api_key])",
    "(main_task pid=55440) wandb: Using wandb-core as the SDK backend.  Please refer to https://wandb.me/wandb-core "
    "for more information.",
    # wandb/docs#1060
    "wandb: W&B API key is configured. Use `wandb login --relogin` to force relogin",
    "sz159@linux31$ wandb login <my-api-key>",
    # apache/ozhera#74
    "Invalid access_token request id: 5373616E-A1FB-750A-A30B-53495AC82560",
    # boto/boto3#2532 (aws configure list, masked by the CLI)
    "access_key ***************kkk shared-credentials-file",
    # I-am-PUID-0/DUMB#86
    "Engine(postgresql+psycopg2://DUMB:***@127.0.0.1/riven) └ <sqlalchemy.engine.base.Connection object at "
    "0x7f4cc0515310>",
    # piyushsachdeva/GitLabCITutorial#1
    "git clone -b develop  https://gitlab+deploy-token-497024:$TOKEN@gitlab.com/piyush.sachdeva055/myfirstproject.git",
    "fatal: Authentication failed for 'https://gitlab+deploy-token-497024:@gitlab.com/piyush.sachdeva055/myfirstpro"
    "ject.git/'",
    # qd-today/qd#586
    "[E 240325 22:15:45 QD.Http.Funcs funcs:436] Sent to QYWX WebHook error: invalid webhook url, hint: [554964369945"
    "4838579293796], from ip: XXX.XXX.XXX.XXX, more info at https://open.work.weixin.qq.com/devtool/query?e=93000",
    # rygwdn/slack-tools#1 (the tool printed only the token's ends)
    "[DEBUG] Token: xoxc-...ee258",
    # whyour/qinglong#1745 (a placeholder, not a hook id)
    "https://open.feishu.cn/open-apis/bot/v2/hook/xxx",
    # OneDragon-Anything/ZenlessZoneZero-OneDragon#923
    "[08:30:42.920] [push.py 606] [ERROR]: 企业微信机器人推送失败！",
    # Jazee6/cloudflare-ai-web#13
    "[nuxt] [request error] [unhandled] [500] [GoogleGenerativeAI Error]: Error fetching from https://generativelangu"
    "age.googleapis.com/v1/models/gemini-pro:streamGenerateContent?alt=sse: [400 Bad Request] API key not valid.",
    # near misses of the shapes (shape)
    "disk-usage-monitor-agent-a1b2c3d4e5f6g7h8 task-0123456789abcdefghij hf_hub_download(repo_id)",
    "ray::core::CoreWorker c10d::ProcessGroupNCCL::WorkNCCL std::vector<int>",
    "val-core/pass@1: 0.53 - val/pass_rate: 0.41 - compass: 3 - bypass=true",
    "    self.client = OpenAI(api_key=os.environ.get('OPENAI_API_KEY'))",
    "PWD=/mnt/shared/users/alice/verl OLDPWD=/root",
    "token: 5, tokens=1024, num_tokens=77, max_new_tokens=512, token_ids=[1, 2, 3], --max-tokens 512",
    "docker run -u 1000:1000 --gpus all; python -u train.py; ssh git@github.com:org/repo.git",
    "password:",
    "api_key=None secret: null credentials: '' HF_TOKEN=${HF_TOKEN} token=<your-token>",
]


@pytest.fixture()
def redactor() -> Redactor:
    return Redactor()


@pytest.mark.parametrize(("line", "secret", "kind"), [case[1:] for case in POSITIVES], ids=[c[0] for c in POSITIVES])
def test_secret_is_masked_and_nothing_else_changes(redactor: Redactor, line: str, secret: str, kind: str) -> None:
    assert line.count(secret) == 1, "the case must hold its secret exactly once"
    assert redactor.redact(line) == line.replace(secret, f"[REDACTED:{kind}]")
    assert redactor.count == 1


@pytest.mark.parametrize("line", NEGATIVES)
def test_evidence_stays_byte_identical(redactor: Redactor, line: str) -> None:
    assert redactor.redact(line) == line
    assert redactor.count == 0


def _text_files() -> list[Path]:
    roots = [TESTS / "fixtures", TESTS / "rca_cases"]
    return sorted(p for root in roots for p in root.rglob("*") if p.is_file())


def test_every_real_log_fixture_stays_byte_identical(redactor: Redactor) -> None:
    files = _text_files()
    assert len(files) > 150, "the fixture trees moved"
    changed = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        if redactor.redact(text) != text:
            changed.append(path.relative_to(TESTS))
    assert changed == []
    assert redactor.count == 0


def test_every_default_pattern_has_a_positive_case(redactor: Redactor) -> None:
    lines = [case[1] for case in POSITIVES]
    for rule in redactor._rules:
        assert any(rule.regex.search(lower_ascii(line) if rule.lowered else line) for line in lines), rule.name


def test_masking_keeps_the_rest_of_a_multiline_text(redactor: Redactor) -> None:
    key = fake("sk-", ALNUM, 48)
    text = f"step:1 - loss:0.5\nexport OPENAI_API_KEY={key}\nstep:2 - loss:0.4\n"
    assert (
        redactor.redact(text)
        == "step:1 - loss:0.5\nexport OPENAI_API_KEY=[REDACTED:openai_api_key]\nstep:2 - loss:0.4\n"
    )


def test_count_counts_values_not_patterns(redactor: Redactor) -> None:
    key = fake("sk-", ALNUM, 48)
    # the key is found by the OpenAI shape and by the key=value rule: one value, named after the specific shape
    assert redactor.redact(f"OPENAI_API_KEY={key}") == "OPENAI_API_KEY=[REDACTED:openai_api_key]"
    assert redactor.count == 1
    redactor.redact(f"a={key} b={key}")
    assert redactor.count == 3
    assert redactor.counts == {"openai_api_key": 3}
    redactor.redact("nothing here")
    assert redactor.count == 3


def test_unchanged_text_is_returned_as_is(redactor: Redactor) -> None:
    text = "step:1 - loss:0.5"
    assert redactor.redact(text) is text
    assert redactor.redact("") == ""


# --- hostile input ---------------------------------------------------------------------------------------

MB = 1024 * 1024
# Each hostile shape as a function of its repeat count, and the count that makes about 1 MB.
HOSTILE: dict[str, tuple[Callable[[int], str], int]] = {
    "a= repeated": (lambda n: "a=" * n, MB // 2),
    "long base64 run": (lambda n: "QUJDRGVmZ2g0NTY3" * n, MB // 16),
    "sk- then base64": (lambda n: "sk-" + "QUJDRGVmZ2g0NTY3" * n, MB // 16),
    "nested quotes": (lambda n: "password=\"'" * n, MB // 12),
    "unclosed quote": (lambda n: 'api_key="' + "a" * n, MB),
    "keyword repeated": (lambda n: "token=" * n, MB // 6),
    "flags repeated": (lambda n: "--a" * n, MB // 3),
    "dashes": (lambda n: "-" * n, MB),
    "BEGIN without END": (lambda n: "-----BEGIN PRIVATE KEY-----\n" + "QUJD\n" * n, MB // 5),
    "many BEGINs": (lambda n: "-----BEGIN RSA PRIVATE KEY-----" * n, MB // 31),
    "at signs": (lambda n: "://a:" + "@" * n, MB),
    "NUL bytes": (lambda n: "\x00password=\x00" * n, MB // 11),
    "invalid surrogates": (lambda n: "\ud800token=abc\udfff" * n, MB // 11),
    "colons": (lambda n: "ab:cd::" * n, MB // 7),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_takes_linear_time(name: str) -> None:
    # Linear costs well under a second a MB; backtracking on 1 MB would take hours.
    redactor = Redactor(mask_ips=True, mask_users=True, users=["alice"])
    make, size = HOSTILE[name]
    assert_linear(redactor.redact, make, size)


def test_secrets_around_nul_bytes_and_surrogates_are_masked_and_the_rest_kept(redactor: Redactor) -> None:
    key = fake("hf_", string.ascii_letters, 34)
    text = f"\x00\ud800HF_TOKEN={key}\udfff\x00 ok"
    assert redactor.redact(text) == "\x00\ud800HF_TOKEN=[REDACTED:huggingface_token]\udfff\x00 ok"


def test_a_value_longer_than_the_bound_is_still_masked_from_its_start(redactor: Redactor) -> None:
    out = redactor.redact("password=" + "a" * 20000)
    assert out.startswith("password=[REDACTED:secret]")


# --- pseudonyms ------------------------------------------------------------------------------------------


def test_ips_get_stable_pseudonyms_across_calls() -> None:
    redactor = Redactor(mask_ips=True)
    a = "(WorkerDict pid=123, ip=10.95.143.7) INFO loaded in 3.2 seconds"
    b = "(WorkerDict pid=456, ip=10.95.143.9) INFO loaded; rank on 10.95.143.7 failed"
    assert redactor.redact(a) == "(WorkerDict pid=123, ip=ip-1) INFO loaded in 3.2 seconds"
    assert redactor.redact(b) == "(WorkerDict pid=456, ip=ip-2) INFO loaded; rank on ip-1 failed"
    assert Redactor(mask_ips=True).redact(b).count("ip-1") == 1  # another Redactor numbers afresh
    assert redactor.counts == {"ip": 3}


def test_ipv6_is_masked_but_loopback_versions_and_cxx_names_are_not() -> None:
    redactor = Redactor(mask_ips=True)
    # dataease/SQLBot#138
    line = "- host: 'localhost', port: 5432, hostaddr: '::1': connection failed: connection to server at \"::1\""
    assert redactor.redact(line) == line
    assert redactor.redact("peer fe80::1%eth0 and 2001:db8::8a2e:370:7334 down") == "peer ip-1 and ip-2 down"
    assert redactor.redact("[2001:0db8:0000:0000:0000:8a2e:0370:7334]:8080") == "[ip-2]:8080"  # same address
    kept = "c10d::ProcessGroupNCCL ray::core a::b mac 00:1a:2b:3c:4d:5e at 15:02:33,117 v1.2.3.4 1.2.3 0.0.0.0:8265"
    assert redactor.redact(kept) == kept


def test_users_in_paths_and_given_names_share_pseudonyms() -> None:
    redactor = Redactor(mask_users=True, users=["johnzyx", "Alice"])
    # hiyouga/EasyR1#69
    line = '  File "/home/johnzyx/working/pythonprojects/EasyR1/verl/trainer/main.py", line 97, in <module>'
    assert redactor.redact(line) == line.replace("johnzyx", "user-1")
    # wandb/docs#1060
    line = "wandb: Appending key for api.wandb.ai to your netrc file: /home/users/sz159/.netrc"
    assert redactor.redact(line) == line.replace("sz159", "user-2")
    assert redactor.redact("job by alice in /mnt/shared/users/alice/ckpt, /Users/johnzyx/x") == (
        "job by user-3 in /mnt/shared/users/user-3/ckpt, /Users/user-1/x"
    )
    assert redactor.redact("malice and alice_2 stay") == "malice and alice_2 stay"


def test_pseudonyms_never_split_a_secret() -> None:
    redactor = Redactor(mask_ips=True, mask_users=True, users=["alice"])
    assert redactor.redact("postgresql://alice:pw@10.0.0.5/db") == "postgresql://user-1:[REDACTED:url_password]@ip-1/db"
    assert redactor.redact("password=10.0.0.5") == "password=[REDACTED:secret]"


# --- nested data -----------------------------------------------------------------------------------------


def test_redact_data_masks_values_under_secret_keys_whatever_their_type() -> None:
    redactor = Redactor()
    spec = {
        "entrypoint": "python3 -m verl.trainer.main_ppo --api-key tok-8f14e45fceea",
        "runtime_env": {
            "env_vars": {
                "WANDB_API_KEY": "0123456789",
                "HF_TOKEN": fake("", ALNUM, 30),
                "PWD": "/mnt/shared/jobs/raysubmit_1",
                "NCCL_DEBUG": "INFO",
            }
        },
        "credentials": {"user": "ray", "pass": "x"},
        "db_password": 12345,
        "Authorization": "Bearer x",
        "api_key": None,
        "auth": {"enabled": True},
        "max_tokens": 512,
        "tokenizer": "/mnt/shared/common/models/Qwen2.5-7B-Instruct",
        "pad_token": "<|endoftext|>",
        "token_ids": [151643, 151645],
        "argv": ["--password", "hunter2", "--max-tokens", "512", "--api-key", "--verbose"],
    }
    out = redactor.redact_data(spec)
    assert out == {
        "entrypoint": "python3 -m verl.trainer.main_ppo --api-key [REDACTED:secret]",
        "runtime_env": {
            "env_vars": {
                "WANDB_API_KEY": "[REDACTED:secret]",
                "HF_TOKEN": "[REDACTED:token]",
                "PWD": "/mnt/shared/jobs/raysubmit_1",
                "NCCL_DEBUG": "INFO",
            }
        },
        "credentials": "[REDACTED:secret]",
        "db_password": "[REDACTED:secret]",
        "Authorization": "[REDACTED:authorization]",
        "api_key": None,
        "auth": {"enabled": True},
        "max_tokens": 512,
        "tokenizer": "/mnt/shared/common/models/Qwen2.5-7B-Instruct",
        "pad_token": "<|endoftext|>",
        "token_ids": [151643, 151645],
        "argv": ["--password", "[REDACTED:secret]", "--max-tokens", "512", "--api-key", "--verbose"],
    }
    assert spec["runtime_env"]["env_vars"]["WANDB_API_KEY"] == "0123456789"  # the input is not modified
    assert redactor.count == 7


def test_redact_data_keeps_container_types_and_untouched_objects() -> None:
    Point = namedtuple("Point", "host password")
    redactor = Redactor(mask_ips=True)
    key = fake("hf_", string.ascii_letters, 34)
    data = (Point("10.0.0.1", "x"), {"HF_TOKEN=" + key}, frozenset({"a"}), b"token=" + key.encode(), 3.5, None)
    out = redactor.redact_data(data)
    assert type(out) is tuple and type(out[0]) is Point and type(out[1]) is set and type(out[2]) is frozenset
    assert out[0] == Point("ip-1", "x")  # a named tuple's fields are not keys
    assert out[1] == {"HF_TOKEN=[REDACTED:huggingface_token]"}
    assert out[3] == b"token=[REDACTED:huggingface_token]"
    assert out[2] is data[2] or out[2] == data[2]
    assert out[4:] == (3.5, None)


def test_redact_data_bounds_depth_cycles_and_shared_structure() -> None:
    redactor = Redactor()
    deep: list = ["password=hunter2"]
    for _ in range(5000):
        deep = [deep]
    out = redactor.redact_data(deep)
    for _ in range(MAX_DEPTH):
        out = out[0]
    assert out == "[REDACTED:too_deep]"

    cyclic: dict = {"a": "ok"}
    cyclic["self"] = cyclic
    assert redactor.redact_data(cyclic) == {"a": "ok", "self": "[REDACTED:cycle]"}

    shared: list = ["secret=x"]
    for _ in range(40):  # 2**40 paths, 41 distinct lists
        shared = [shared, shared]
    # each distinct list once: 41 lists cost microseconds, the 2**40 paths would never end
    assert_bounded(redactor.redact_data, shared, most_cpu_s=1.0)


def test_redact_data_keeps_keys_that_redact_alike_apart() -> None:
    redactor = Redactor(mask_ips=True)
    key_a, key_b = "sk-" + fake("", ALNUM, 30, "a"), "sk-" + fake("", ALNUM, 30, "b")
    out = redactor.redact_data({key_a: 1, key_b: 2})
    assert sorted(out.values()) == [1, 2] and all("[REDACTED:openai_api_key]" in key for key in out)


# --- configuration ---------------------------------------------------------------------------------------


def test_extra_patterns_mask_with_their_name() -> None:
    redactor = Redactor(extra_patterns=[("ticket", r"TICKET-[0-9]{4,}"), ("(?i)corp-[a-z]{8}")])
    assert redactor.redact("see TICKET-12345 and CORP-ABCDEFGH") == "see [REDACTED:ticket] and [REDACTED:custom]"
    grouped = Redactor(extra_patterns=[("employee", r"emp_id=(?P<employee>[0-9]{6})")])
    assert grouped.redact("emp_id=123456 ok") == "emp_id=[REDACTED:employee] ok"
    unanchored = Redactor(extra_patterns=[("badge", r"\b[0-9]{3}-[0-9]{4}\b")])  # no literal prefix: its own pass
    assert unanchored.redact("badge 555-1234 ok") == "badge [REDACTED:badge] ok"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([("mine", "(unclosed")], "'mine' does not compile"),
        ([("mine", "a*")], "'mine' matches the empty string"),
        ([("mine", r"(\w+\s?)*x")], "'mine' nests an unbounded repeat"),
        ([("Bad Name", "x")], "name 'Bad Name' is not a valid kind name"),
        ([("mine", "")], "'mine' is '', not a regular expression"),
        ([("a", "b", "c")], "is neither a regex nor a (name, regex) pair"),
    ],
)
def test_a_bad_extra_pattern_fails_at_construction_naming_it(extra: list, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Redactor(extra_patterns=extra)
    assert message in err.value.message
    assert err.value.hint


def test_user_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="mask_users is off"):
        Redactor(users=["alice"])
    with pytest.raises(ConfigError, match="cannot be masked"):
        Redactor(mask_users=True, users=["a"])


def test_redact_takes_only_text(redactor: Redactor) -> None:
    with pytest.raises(InputError, match="takes a str, not bytes"):
        redactor.redact(b"password=x")  # type: ignore[arg-type]
