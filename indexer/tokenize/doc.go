// Package tokenize reproduces llm-d-inference-sim's dummy tokenizer: how it
// flattens chat messages into text, splits text into tokens and numbers them.
//
// # Basics
//
// A chat request is flattened to "### " + role + ": " + content + "\n" per
// message, concatenated; a completion prompt is used as it is. The text is
// split like the sim's regular expression Pattern (Go regexp, ASCII \w and
// \s): a punctuation character or a run of word characters, each with the
// whitespace that follows it; other characters are skipped. A token's id is
// FNV-1a 32-bit of its bytes, whitespace included.
//
// AppendIDs and Tokenizer.AppendChat append ids to a caller's slice and, with
// room in it, allocate nothing. AppendIDsMax and AppendChatMax stop where the
// token after a limit starts and say so, for servers that refuse text over a
// token limit: their cost is bounded by the limit, not by the text, and
// AppendChatMax renders the messages without flattening them into a buffer.
// ParseChat reads an OpenAI chat request body or a bare messages array.
//
// Sources: llm-d-inference-sim pkg/tokenizer/tokenizer.go (the regular
// expression, FindAllString, fnv32, RenderMessages), pkg/openai-server-api
// (StartMessageSeparator "### ", EndMessageSeparator "\n", PlainText(true)
// prefixes role + ": ", content_test.go: structured content is the text of
// each "text" part followed by one space). Checked: the token count of every
// recorded request equals the sim's usage.prompt_tokens, and the scanner
// equals the regular expression on every recorded prompt and under fuzzing.
//
// # Caveats
//
// This is not a model tokenizer: it matches the sim run with its dummy
// tokenizer (--force-dummy-tokenizer, or no --render-url) and nothing else.
// Callers in front of a real model send token ids. Messages' tool calls,
// names and non-text parts are not rendered, as in the sim for text parts;
// the sim's multimodal placeholders are not reproduced.
package tokenize
