package events

import "bytes"

// topicPrefix starts the topics of llm-d-inference-sim and of vLLM as llm-d
// configures it: kv@<pod>@<model>.
var topicPrefix = []byte("kv@")

// ParseTopic splits a topic of the form kv@<pod>@<model> into the pod
// (ip:port) and the model, as sub-slices of topic: nothing is allocated.
// The pod ends at the second '@'; the model is everything after it and may
// itself contain '@'. ok is false for an empty or foreign topic (another
// prefix, no second '@', an empty pod): the caller then identifies the
// source by the endpoint it came from.
func ParseTopic(topic []byte) (pod, model []byte, ok bool) {
	if !bytes.HasPrefix(topic, topicPrefix) {
		return nil, nil, false
	}
	rest := topic[len(topicPrefix):]
	i := bytes.IndexByte(rest, '@')
	if i <= 0 {
		return nil, nil, false
	}
	return rest[:i:i], rest[i+1:], true
}
