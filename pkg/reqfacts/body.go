package reqfacts

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

// A request body is read in one pass (docs/tokenizer.md, "Decision cost at
// long context"): the pass validates the whole body as strictly as
// encoding/json, keeps each field the facts need as a slice of the body
// (what json.Unmarshal into body's json.RawMessage fields gave, without the
// copies), and decodes a chat's messages as it meets them, reusing the
// decoded messages a MessageCache holds for a byte-identical leading part
// of the array.

// errNotMessageList: messages is valid JSON but not a list of objects, or
// nested deeper than the chat template accepts.
var errNotMessageList = errors.New("messages is not a list of objects")

// scanned is what one pass over a body gives.
type scanned struct {
	body
	// messages holds the decoded messages when the pass decoded them;
	// messagesErr is set when messages was valid JSON of the wrong shape.
	messages    []map[string]any
	messagesErr error
}

// scanBody reads a JSON object body. decodeMessages asks for the messages
// array to be decoded too (chat), with cache (nil: none) for the leading
// messages seen before.
func scanBody(data []byte, decodeMessages bool, cache *MessageCache) (scanned, error) {
	var s scanned
	r := chattemplate.NewJSONReader(data)
	empty, err := r.Open('{', '}')
	if err != nil {
		return s, err
	}
	for more := !empty; more; {
		key, err := r.Key()
		if err != nil {
			return s, err
		}
		slot := s.slot(key)
		start := offsetOfValue(r)
		if slot == &s.Messages && decodeMessages {
			// A repeated key is decoded again: the last one wins, as in
			// json.Unmarshal.
			if s.messages, s.messagesErr, err = readMessages(r, cache); err != nil {
				return s, err
			}
		} else if err := r.Skip(1); err != nil {
			return s, err
		}
		if slot != nil {
			*slot = data[start:r.Offset()]
		}
		if more, err = r.Next('}'); err != nil {
			return s, err
		}
	}
	return s, r.End()
}

func offsetOfValue(r *chattemplate.JSONReader) int {
	r.SkipSpace()
	return r.Offset()
}

// slot is the field json.Unmarshal would store key's value in: an exact
// name, else a case-folded match, as encoding/json matches struct fields.
func (b *body) slot(key string) *json.RawMessage {
	if p := b.exactSlot(key); p != nil {
		return p
	}
	folded := foldName(key)
	for _, name := range bodyFieldNames {
		if folded == strings.ToUpper(name) {
			return b.exactSlot(name)
		}
	}
	return nil
}

var bodyFieldNames = [...]string{
	"model", "prompt", "messages", "tools", "documents", "chat_template_kwargs", "chat_template",
	"reasoning_effort", "add_generation_prompt", "continue_final_message", "add_special_tokens",
	"truncate_prompt_tokens", "cache_salt", "stream", "user",
}

func (b *body) exactSlot(key string) *json.RawMessage {
	switch key {
	case "model":
		return &b.Model
	case "prompt":
		return &b.Prompt
	case "messages":
		return &b.Messages
	case "tools":
		return &b.Tools
	case "documents":
		return &b.Documents
	case "chat_template_kwargs":
		return &b.ChatTemplateKwargs
	case "chat_template":
		return &b.ChatTemplate
	case "reasoning_effort":
		return &b.ReasoningEffort
	case "add_generation_prompt":
		return &b.AddGenerationPrompt
	case "continue_final_message":
		return &b.ContinueFinalMessage
	case "add_special_tokens":
		return &b.AddSpecialTokens
	case "truncate_prompt_tokens":
		return &b.TruncatePromptTokens
	case "cache_salt":
		return &b.CacheSalt
	case "stream":
		return &b.Stream
	case "user":
		return &b.User
	}
	return nil
}

// foldName folds a key as encoding/json does to match a field name case
// insensitively: ASCII letters to upper case, any other rune to the
// smallest rune of its Unicode simple-fold orbit ("ſ" matches "S", the
// Kelvin sign "K").
func foldName(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); {
		if c := key[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			b.WriteByte(c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(key[i:])
		b.WriteRune(smallestFold(r))
		i += n
	}
	return b.String()
}

func smallestFold(r rune) rune {
	for {
		next := unicode.SimpleFold(r)
		if next <= r {
			return next
		}
		r = next
	}
}

// readMessages decodes the messages value. A value of the wrong shape is
// still validated to its end, so that a body that is not JSON at all is
// reported as such: shapeErr is for the former, err for the latter.
func readMessages(r *chattemplate.JSONReader, cache *MessageCache) (msgs []map[string]any, shapeErr, err error) {
	start := r.Offset()
	msgs, err = decodeMessageArray(r, cache)
	if err == nil {
		return msgs, nil, nil
	}
	r.Seek(start)
	if serr := r.Skip(1); serr != nil {
		return nil, nil, serr
	}
	return nil, fmt.Errorf("%w: %w", errNotMessageList, err), nil
}

// decodeMessageArray decodes a JSON array of message objects, taking the
// leading messages from cache when their bytes are the cached ones, and
// stores the result in cache for the next turn.
func decodeMessageArray(r *chattemplate.JSONReader, cache *MessageCache) ([]map[string]any, error) {
	if r.SkipSpace() != '[' {
		return nil, errors.New("not a list")
	}
	start := r.Offset()
	rest := r.Data()[start:]
	prev, reused := cache.lookup(rest)
	var dec decodedMessages
	more := true
	reusedBytes := 0
	if reused > 0 {
		dec = prev.dec.prefix(reused)
		reusedBytes = dec.ends[reused-1]
		r.Seek(start + reusedBytes)
		var err error
		if more, err = r.Next(']'); err != nil {
			return nil, err
		}
	} else {
		empty, err := r.Open('[', ']')
		if err != nil {
			return nil, err
		}
		more = !empty
	}
	for more {
		m, isObject, err := r.ObjectMap(1)
		if err != nil {
			return nil, err
		}
		if !isObject {
			return nil, fmt.Errorf("message %d is not an object", len(dec.msgs))
		}
		dec.add(m, r.Offset()-start)
		if more, err = r.Next(']'); err != nil {
			return nil, err
		}
	}
	cache.store(rest[:r.Offset()-start], dec, prev, reusedBytes)
	return dec.msgs, nil
}
