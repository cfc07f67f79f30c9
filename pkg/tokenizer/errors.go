package tokenizer

import (
	"errors"
	"fmt"
)

// ErrNotFound is returned (wrapped) when a tokenizer.json is not staged where
// it was looked for. It also matches fs.ErrNotExist through errors.Is.
var ErrNotFound = errors.New("tokenizer not found")

// UnsupportedError names a tokenizer.json component this package cannot run
// exactly (a model type such as "WordPiece", a normalizer, a pre-tokenizer...).
// Loading fails rather than producing ids that would differ from HuggingFace.
type UnsupportedError struct {
	Component string // "model", "normalizer", "pre_tokenizer", "post_processor", "pattern"
	Type      string // the "type" value found, e.g. "Unigram"
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("tokenizer: unsupported %s type %q", e.Component, e.Type)
}

// UnsupportedModelError is the UnsupportedError for the model component; it is
// the same type, kept under the name the gateway's miss mapping uses.
type UnsupportedModelError = UnsupportedError

// ParseError reports a tokenizer.json or tokenizer_config.json that is not
// valid (bad JSON, missing vocab, a merge naming an unknown token...).
type ParseError struct {
	Path string
	Err  error
}

func (e *ParseError) Error() string { return fmt.Sprintf("tokenizer: parse %s: %v", e.Path, e.Err) }
func (e *ParseError) Unwrap() error { return e.Err }

// notFoundError wraps both ErrNotFound and the underlying fs error.
type notFoundError struct {
	path string
	err  error
}

func (e *notFoundError) Error() string {
	return fmt.Sprintf("tokenizer: %s: %v", e.path, ErrNotFound)
}
func (e *notFoundError) Unwrap() []error { return []error{ErrNotFound, e.err} }
