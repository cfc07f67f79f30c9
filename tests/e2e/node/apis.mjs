// Sends one OpenAI Responses API or Anthropic Messages API request through
// kvgate with the official SDK and prints a JSON summary for the Go test to
// check (tests/e2e TestConversationAPIsNodeSDKs). Each API has two calls
// sharing a prefix, one streamed and one not; the Go test runs them in
// order and waits for the first call's KV blocks before the second.
// Usage: node apis.mjs <baseURL> <model> <responses|responsesStream|messagesStream|messages>
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model, call] = process.argv.slice(2);
const headers = (r) => ({ decision: r.headers.get("x-kvgate-decision"), engine: r.headers.get("x-engine-id"), cached: r.headers.get("x-enginesim-cached-tokens") });
const instructions =
  "You are the kvgate end-to-end assistant. Answer in one short sentence. " +
  "The conversation below is about routing requests to the engine that already holds their prefix. ".repeat(3);
const system = "You are the kvgate Anthropic end-to-end assistant. " + "Its system prompt is long enough to fill several KV blocks. ".repeat(3);
const openai = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0, timeout: 30000 });
const anthropic = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });

const calls = {
  async responses() {
    const { data, response } = await openai.responses
      .create({ model, instructions, input: "Which engine holds my prefix?", max_output_tokens: 8 })
      .withResponse();
    return { ...headers(response), text: data.output_text, status: data.status, usage: data.usage };
  },
  async responsesStream() {
    const { data: stream, response } = await openai.responses
      .create({
        model,
        instructions,
        input: [{ role: "user", content: [{ type: "input_text", text: "Which engine holds my prefix, and why?" }] }],
        max_output_tokens: 8,
        stream: true,
      })
      .withResponse();
    const types = [];
    let text = "", usage = null;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === "response.output_text.delta") text += ev.delta;
      if (ev.type === "response.completed") usage = ev.response.usage;
    }
    return { ...headers(response), types, text, usage };
  },
  async messagesStream() {
    const stream = anthropic.messages.stream({
      model,
      max_tokens: 8,
      system: [{ type: "text", text: system }],
      messages: [{ role: "user", content: [{ type: "text", text: "Where is my prefix cached, again?" }] }],
    });
    const types = [];
    stream.on("streamEvent", (ev) => types.push(ev.type));
    const { response } = await stream.withResponse();
    const msg = await stream.finalMessage();
    return { ...headers(response), types, text: msg.content.map((b) => b.text ?? "").join(""), stop: msg.stop_reason, usage: msg.usage };
  },
  async messages() {
    const { data, response } = await anthropic.messages
      .create({ model, max_tokens: 8, system, messages: [{ role: "user", content: "Where is my prefix cached?" }] })
      .withResponse();
    return { ...headers(response), text: data.content.map((b) => b.text ?? "").join(""), stop: data.stop_reason, usage: data.usage };
  },
};
if (!calls[call]) {
  console.error(`unknown call ${call}`);
  process.exit(2);
}
console.log(JSON.stringify(await calls[call]()));
