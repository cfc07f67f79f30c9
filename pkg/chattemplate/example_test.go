package chattemplate_test

import (
	"fmt"

	"github.com/kvgate/kvgate/pkg/chattemplate"
)

func Example() {
	tmpl, err := chattemplate.Compile(`{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`)
	if err != nil {
		panic(err)
	}
	// Request JSON keeps its key order through DecodeMessages.
	msgs, err := chattemplate.DecodeMessages([]byte(`[{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]`))
	if err != nil {
		panic(err)
	}
	prompt, err := tmpl.RenderChat(chattemplate.ChatInput{Messages: msgs, AddGenerationPrompt: true})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%q\n", prompt)
	// Output: "<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n"
}
