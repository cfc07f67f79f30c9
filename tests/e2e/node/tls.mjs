// Streams the same chat completion twice over https through kvgate with the
// official OpenAI SDK (the CA comes from NODE_EXTRA_CA_CERTS) and prints a
// JSON summary: the second request should be a warm KV hit.
// Usage: NODE_EXTRA_CA_CERTS=ca.crt node tls.mjs <https baseURL> <model>
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });

const system =
  "You are the assistant of the kvgate TLS end-to-end test. Answer in one short sentence, " +
  "and keep this long shared system prompt so that the second request reuses its KV blocks.";
const runs = [];
for (let i = 0; i < 2; i++) {
  const { data: stream, response } = await client.chat.completions
    .create({
      model,
      messages: [
        { role: "system", content: system },
        { role: "user", content: "Say something about TLS." },
      ],
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    })
    .withResponse();
  let chunks = 0, text = "", usage = null;
  for await (const chunk of stream) {
    chunks++;
    for (const c of chunk.choices ?? []) text += c.delta?.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  runs.push({ chunks, text, usage, decision: response.headers.get("x-kvgate-decision") });
}
console.log(JSON.stringify(runs));
