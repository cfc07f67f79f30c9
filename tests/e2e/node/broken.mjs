// Streams one long chat completion through kvgate with the official OpenAI
// SDK; tests/fault kills the engine once the first chunk has arrived (the
// "started" line) and checks what the SDK raised (the last line).
// Usage: node broken.mjs <baseURL> <model>
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });
let chunks = 0;
try {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Write a long story." }],
    max_tokens: 800,
    stream: true,
  });
  for await (const chunk of stream) {
    if (chunks++ === 0) console.log(JSON.stringify({ started: true }));
  }
  console.log(JSON.stringify({ ok: true, chunks }));
} catch (e) {
  console.log(JSON.stringify({ ok: false, chunks, name: e.constructor.name, message: String(e.message) }));
}
