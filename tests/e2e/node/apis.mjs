// Sends OpenAI Responses API and Anthropic Messages API requests through
// kvgate with the official SDKs, each API twice with a shared prefix (one
// streamed, one not), and prints a JSON summary for the Go test to check
// (tests/e2e TestConversationAPIsNodeSDKs).
// Usage: node apis.mjs <baseURL> <model>
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model] = process.argv.slice(2);
const headers = (r) => ({ decision: r.headers.get("x-kvgate-decision"), engine: r.headers.get("x-engine-id"), cached: r.headers.get("x-enginesim-cached-tokens") });
const instructions =
  "You are the kvgate end-to-end assistant. Answer in one short sentence. " +
  "The conversation below is about routing requests to the engine that already holds their prefix. ".repeat(3);
const out = {};

const openai = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0, timeout: 30000 });
{
  const { data, response } = await openai.responses
    .create({ model, instructions, input: "Which engine holds my prefix?", max_output_tokens: 8 })
    .withResponse();
  out.responses = { ...headers(response), text: data.output_text, status: data.status, usage: data.usage };
}
{
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
  out.responsesStream = { ...headers(response), types, text, usage };
}

const anthropic = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 30000 });
const system = "You are the kvgate Anthropic end-to-end assistant. " + "Its system prompt is long enough to fill several KV blocks. ".repeat(3);
{
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
  out.messagesStream = { ...headers(response), types, text: msg.content.map((b) => b.text ?? "").join(""), stop: msg.stop_reason, usage: msg.usage };
}
{
  const { data, response } = await anthropic.messages
    .create({ model, max_tokens: 8, system, messages: [{ role: "user", content: "Where is my prefix cached?" }] })
    .withResponse();
  out.messages = { ...headers(response), text: data.content.map((b) => b.text ?? "").join(""), stop: data.stop_reason, usage: data.usage };
}
console.log(JSON.stringify(out));
