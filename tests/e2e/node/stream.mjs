// Streams one chat completion and one completion through kvgate with the
// official OpenAI SDK and prints a JSON summary for the Go test to check.
// Usage: node stream.mjs <baseURL> <model>
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });

const out = {};
{
  const { data: stream, response } = await client.chat.completions
    .create({
      model,
      messages: [
        { role: "system", content: "You are a terse assistant for the kvgate end-to-end test." },
        { role: "user", content: "Say something." },
      ],
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    })
    .withResponse();
  let chunks = 0, text = "", usage = null, finish = null;
  for await (const chunk of stream) {
    chunks++;
    for (const c of chunk.choices ?? []) {
      text += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  out.chat = { chunks, text, usage, finish, engine: response.headers.get("x-engine-id"), decision: response.headers.get("x-kvgate-decision") };
}
{
  const stream = await client.completions.create({ model, prompt: "The kvgate proxy streams", max_tokens: 5, stream: true });
  let chunks = 0, text = "";
  for await (const chunk of stream) {
    chunks++;
    text += chunk.choices?.[0]?.text ?? "";
  }
  out.completion = { chunks, text };
}
console.log(JSON.stringify(out));
