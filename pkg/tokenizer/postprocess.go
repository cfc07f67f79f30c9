package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcessor is the single-sequence part of HF's post_processor: the ids
// added before and after the text when add_special_tokens is true.
type postProcessor struct {
	prefix, suffix []uint32
	// hasTemplate: the post-processor adds tokens itself (TemplateProcessing,
	// Roberta, Bert), as opposed to ByteLevel or none.
	hasTemplate bool
}

type templateItem struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type templateSpecial struct {
	ID  string   `json:"id"`
	IDs []uint32 `json:"ids"`
}

func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	var p postProcessor
	if isNull(raw) {
		return p, nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return p, fmt.Errorf("post_processor: %w", err)
	}
	switch t.Type {
	case "ByteLevel":
		return p, nil
	case "TemplateProcessing":
		return parseTemplateProcessing(raw)
	case "RobertaProcessing", "BertProcessing":
		return parseClsSepProcessing(raw, t.Type)
	case "Sequence":
		var sq struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &sq); err != nil {
			return p, fmt.Errorf("post_processor Sequence: %w", err)
		}
		for _, r := range sq.Processors {
			q, err := parsePostProcessor(r)
			if err != nil {
				return p, err
			}
			p.prefix = append(q.prefix, p.prefix...)
			p.suffix = append(p.suffix, q.suffix...)
			p.hasTemplate = p.hasTemplate || q.hasTemplate
		}
		return p, nil
	}
	return p, &UnsupportedError{Component: "post_processor", Type: t.Type}
}

// parseTemplateProcessing takes the special tokens of the single-sequence
// template: those before $A are the prefix, those after it the suffix.
func parseTemplateProcessing(raw json.RawMessage) (postProcessor, error) {
	var p postProcessor
	var tp struct {
		Single        []templateItem             `json:"single"`
		SpecialTokens map[string]templateSpecial `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &tp); err != nil {
		return p, fmt.Errorf("post_processor TemplateProcessing: %w", err)
	}
	p.hasTemplate = true
	seenA := false
	for _, it := range tp.Single {
		switch {
		case it.Sequence != nil:
			seenA = true
		case it.SpecialToken != nil:
			sp, ok := tp.SpecialTokens[it.SpecialToken.ID]
			if !ok {
				return p, fmt.Errorf("post_processor: template names unknown special token %q", it.SpecialToken.ID)
			}
			if seenA {
				p.suffix = append(p.suffix, sp.IDs...)
			} else {
				p.prefix = append(p.prefix, sp.IDs...)
			}
		}
	}
	return p, nil
}

// parseClsSepProcessing parses RobertaProcessing and BertProcessing (typ):
// cls before the text, sep after it.
func parseClsSepProcessing(raw json.RawMessage, typ string) (postProcessor, error) {
	var p postProcessor
	var rp struct {
		Sep [2]json.RawMessage `json:"sep"`
		Cls [2]json.RawMessage `json:"cls"`
	}
	if err := json.Unmarshal(raw, &rp); err != nil {
		return p, fmt.Errorf("post_processor %s: %w", typ, err)
	}
	var cls, sep uint32
	if err := json.Unmarshal(rp.Cls[1], &cls); err != nil {
		return p, fmt.Errorf("post_processor %s cls: %w", typ, err)
	}
	if err := json.Unmarshal(rp.Sep[1], &sep); err != nil {
		return p, fmt.Errorf("post_processor %s sep: %w", typ, err)
	}
	p.hasTemplate = true
	p.prefix, p.suffix = []uint32{cls}, []uint32{sep}
	return p, nil
}

// resolve checks the ids against the vocabulary.
func (p *postProcessor) resolve(t *Tokenizer) error {
	for _, id := range append(append([]uint32(nil), p.prefix...), p.suffix...) {
		if int(id) >= t.vocabSize {
			return fmt.Errorf("post_processor: special id %d outside the vocabulary", id)
		}
	}
	return nil
}

// SpecialPrefix returns the ids the post-processor puts before the text when
// add_special_tokens is true (e.g. BOS), and SpecialSuffix those after it.
func (t *Tokenizer) SpecialPrefix() []uint32 { return append([]uint32(nil), t.post.prefix...) }

// SpecialSuffix: see SpecialPrefix.
func (t *Tokenizer) SpecialSuffix() []uint32 { return append([]uint32(nil), t.post.suffix...) }
