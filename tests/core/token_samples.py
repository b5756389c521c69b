# ruff: noqa: RUF001  (real CJK text uses fullwidth punctuation)
"""Fixed text samples by script class, for calibrating the heuristic token estimate."""

from __future__ import annotations

PROSE = (
    "The journal is the canonical history of a conversation, and everything the model reads "
    "is derived from it. When a user asks a question, the service first commits the question, "
    "then projects a context that fits the model's window, and only then calls the model. "
    "If the call fails, nothing is lost: the question is still there, and the next attempt "
    "starts from the same place. Summaries and rollbacks never rewrite history; they are new "
    "entries that the projection honours, so an auditor can always see what happened and why. "
    "Nothing about this is new. Accountants have kept ledgers this way for centuries, because "
    "a record you may not change is a record you can trust, and a record you can trust is "
    "worth far more than a tidy one. Would you like to know more? Ask the librarian, who "
    "remembers every book she has ever shelved, including the ones nobody has borrowed since "
    "nineteen seventy-two."
)

CODE = '''\
async def append_entries(engine, tenant_id: str, session_id: str, rows: list[dict]) -> int:
    """Append rows atomically at rev+1.., or not at all."""
    async with engine.begin() as conn:
        rev = await advance_rev(conn, tenant_id, session_id, len(rows))
        if rev is None:
            raise Conflict("rev_conflict", f"the session is at rev {rev}", {"rev": rev})
        for offset, row in enumerate(rows):
            row["seq"] = rev - len(rows) + 1 + offset
        await conn.execute(insert(entries).values(rows))
    return rev


export function debounce<T extends (...args: unknown[]) => void>(fn: T, ms = 250): T {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return ((...args: unknown[]) => {
    if (timer !== undefined) clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  }) as T;
}

SELECT s.id, count(e.seq) AS entries FROM sessions s JOIN entries e ON e.session_id = s.id
WHERE s.tenant_id = $1 AND e.created_at > now() - interval '7 days' GROUP BY s.id;
{"model": "openai:gpt-4o-mini", "max_input_tokens": 128000, "tools": [{"name": "get_weather"}]}
'''

CJK = (
    "日志是对话的规范历史，模型读取的一切都由它推导而来。当用户提出问题时，服务首先提交问题，"
    "然后投射出适合模型窗口的上下文，最后才调用模型。如果调用失败，什么也不会丢失：问题仍然在那里，"
    "下一次尝试从同一个地方开始。摘要和回滚从不改写历史，它们是投射所遵循的新条目。\n"
    "ジャーナルは会話の正式な履歴であり、モデルが読むものはすべてそこから導き出されます。"
    "ユーザーが質問すると、サービスはまず質問を記録し、次にモデルのウィンドウに収まる文脈を作り、"
    "それからモデルを呼び出します。東京の天気は明日も雨になるでしょう。\n"
    "저널은 대화의 공식 기록이며 모델이 읽는 모든 것은 여기에서 파생됩니다. 사용자가 질문하면 "
    "서비스는 먼저 질문을 기록하고 모델의 창에 맞는 문맥을 만든 다음 모델을 호출합니다."
)

EMOJI = (
    "😀😃😄😁😆😅😂🤣🥲☺️😊😇🙂🙃😉😌😍🥰😘😗😙😚😋😛😝😜🤪🤨🧐🤓😎🥸🤩🥳"
    "👍👎👏🙌👐🤲🤝🙏✌️🤞🤟🤘👌🤌🤏👈👉👆👇☝️✋🤚🖐️🖖👋🤙💪🦾"
    "👨‍👩‍👧‍👦👩🏽‍💻🧑🏿‍🚀🏳️‍🌈🇯🇵🇫🇷🇧🇷❤️🧡💛💚💙💜🖤🤍🤎💔❣️💕💞💓💗💖💘💝"
    "🍏🍎🍐🍊🍋🍌🍉🍇🍓🫐🍈🍒🍑🥭🍍🥥🥝🍅🍆🥑🥦🥬🥒🌶️🫑🌽🥕🫒🧄🧅🥔🍠"
    "🚗🚕🚙🚌🚎🏎️🚓🚑🚒🚐🛻🚚🚛🚜🦯🦽🦼🛴🚲🛵🏍️🛺🚨🚔🚍🚘🚖🚡🚠🚟🚃🚋"
)

SAMPLES = {"prose": PROSE, "code": CODE, "cjk": CJK, "emoji": EMOJI}
