package codec

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
)

// decoderField is what the decoder knows of one field of Query: its
// number, the kind it decodes, and whether it is repeated and, if so,
// declared packed.
type decoderField struct {
	num    protowire.Number
	kind   protoreflect.Kind
	list   bool
	packed bool
}

// decoderFields are Query's fields as queryDecoder.decode reads them. A
// field added to Query must be added here and taught to the decoder.
var decoderFields = map[protoreflect.Name]decoderField{
	"model":        {fieldModel, protoreflect.StringKind, false, false},
	"lora":         {fieldLoRA, protoreflect.StringKind, false, false},
	"cache_salt":   {fieldCacheSalt, protoreflect.StringKind, false, false},
	"token_ids":    {fieldTokenIDs, protoreflect.Fixed32Kind, true, true},
	"block_hashes": {fieldBlockHashes, protoreflect.Fixed64Kind, true, true},
	"prompt":       {fieldPrompt, protoreflect.StringKind, false, false},
	"messages":     {fieldMessages, protoreflect.MessageKind, true, false},
	"pods":         {fieldPods, protoreflect.StringKind, true, false},
}

// TestDecoderKnowsEveryField walks Query's descriptor: every field must be
// one the decoder knows, under the same number, kind and cardinality, and
// decode as proto.Unmarshal decodes it, alone and with every other field,
// in every encoding the wire format allows (packed and unpacked repeated
// scalars, a field split over several records, a singular field given
// twice). A field added to the .proto that the decoder does not read is
// dropped by it as unknown, and fails here.
func TestDecoderKnowsEveryField(t *testing.T) {
	md := (&prefixdv1.Query{}).ProtoReflect().Descriptor()
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		known, ok := decoderFields[fd.Name()]
		if !ok {
			t.Errorf("field %s (number %d) of %s is not known to the decoder: teach queryDecoder.decode to read it and add it to decoderFields",
				fd.Name(), fd.Number(), md.FullName())
			continue
		}
		if fd.Number() != known.num || fd.Kind() != known.kind || fd.IsList() != known.list || fd.IsPacked() != known.packed {
			t.Errorf("field %s: the schema has number %d, %s, list %v, packed %v; the decoder reads number %d, %s, list %v, packed %v",
				fd.Name(), fd.Number(), fd.Kind(), fd.IsList(), fd.IsPacked(), known.num, known.kind, known.list, known.packed)
		}
		if fd.ContainingOneof() != nil || fd.IsMap() || fd.HasPresence() {
			t.Errorf("field %s: oneofs, maps and explicit presence are not decoded", fd.Name())
		}
	}
	for name, known := range decoderFields {
		if fields.ByName(name) == nil {
			t.Errorf("the decoder reads field %s (number %d), which %s does not have", name, known.num, md.FullName())
		}
	}
	// The decoder counts content parts to reserve their memory.
	parts := (&prefixdv1.ChatMessage{}).ProtoReflect().Descriptor().Fields().ByName("parts")
	if parts == nil || parts.Number() != fieldMessageParts || !parts.IsList() || parts.Kind() != protoreflect.MessageKind {
		t.Errorf("ChatMessage.parts is %v; the decoder counts field %d as parts", parts, fieldMessageParts)
	}

	rng := rand.New(rand.NewPCG(5, 6))
	for i := range fields.Len() {
		fd := fields.Get(i)
		t.Run(string(fd.Name()), func(t *testing.T) {
			for range 20 {
				m := new(prefixdv1.Query)
				setRandom(m.ProtoReflect(), fd, rng, 0)
				for name, b := range encodings(t, m, fd) {
					checkDescriptor(t, fmt.Sprintf("%s %s", fd.Name(), name), b)
				}
			}
		})
	}
	t.Run("all", func(t *testing.T) {
		for range 50 {
			m := new(prefixdv1.Query)
			fillRandom(m.ProtoReflect(), rng, 0)
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			checkDescriptor(t, "all fields", b)
			// Fields in reverse order: the wire format allows any.
			var rev []byte
			for i := fields.Len() - 1; i >= 0; i-- {
				one := new(prefixdv1.Query)
				if fd := fields.Get(i); m.ProtoReflect().Has(fd) {
					one.ProtoReflect().Set(fd, m.ProtoReflect().Get(fd))
				}
				ob, err := proto.Marshal(one)
				if err != nil {
					t.Fatal(err)
				}
				rev = append(rev, ob...)
			}
			checkDescriptor(t, "all fields, reversed", rev)
		}
	})
}

// checkDescriptor decodes b with DecodeQuery (into a message left dirty),
// with a Target, and with proto.Unmarshal, which must all agree.
func checkDescriptor(t *testing.T, what string, b []byte) {
	t.Helper()
	want := new(prefixdv1.Query)
	if err := proto.Unmarshal(b, want); err != nil {
		t.Fatalf("%s: proto.Unmarshal: %v", what, err)
	}
	if u := want.ProtoReflect().GetUnknown(); len(u) > 0 {
		t.Fatalf("%s: proto.Unmarshal left unknown fields %x: the test encodes a field the schema lacks", what, u)
	}
	dirty := &prefixdv1.Query{Model: "old", TokenIds: []uint32{9, 9}, BlockHashes: make([]uint64, 3, 8), Pods: []string{"old"},
		Messages: []*prefixdv1.ChatMessage{{Role: "old"}}}
	if err := DecodeQuery(b, dirty); err != nil {
		t.Fatalf("%s: DecodeQuery: %v; proto.Unmarshal accepts %x", what, err, b)
	}
	if !proto.Equal(want, dirty) {
		t.Fatalf("%s: DecodeQuery gave\n%v\nproto.Unmarshal\n%v", what, dirty, want)
	}
	tg := NewTarget(new(prefixdv1.Query))
	tg.Reserve = func(int) error { return nil }
	tg.decode(b)
	if tg.Err != nil || !proto.Equal(want, tg.Msg) {
		t.Fatalf("%s: Target gave %v, %v; proto.Unmarshal %v", what, tg.Msg, tg.Err, want)
	}
}

// encodings returns m, which sets only fd, in each encoding the wire
// format allows for fd.
func encodings(t *testing.T, m *prefixdv1.Query, fd protoreflect.FieldDescriptor) map[string][]byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{"as marshalled": b}
	rm := m.ProtoReflect()
	switch {
	case fd.IsList() && isScalar(fd.Kind()):
		l := rm.Get(fd).List()
		var packed, unpacked, payload []byte
		for i := range l.Len() {
			typ, v := appendScalar(nil, fd.Kind(), l.Get(i))
			unpacked = protowire.AppendTag(unpacked, fd.Number(), typ)
			unpacked = append(unpacked, v...)
			payload = append(payload, v...)
		}
		packed = protowire.AppendTag(packed, fd.Number(), protowire.BytesType)
		packed = protowire.AppendBytes(packed, payload)
		out["packed"], out["unpacked"] = packed, unpacked
		// Half packed, half not: one list.
		half := l.Len() / 2
		var mixed, firstHalf []byte
		for i := range half {
			_, v := appendScalar(nil, fd.Kind(), l.Get(i))
			firstHalf = append(firstHalf, v...)
		}
		mixed = protowire.AppendTag(mixed, fd.Number(), protowire.BytesType)
		mixed = protowire.AppendBytes(mixed, firstHalf)
		for i := half; i < l.Len(); i++ {
			typ, v := appendScalar(nil, fd.Kind(), l.Get(i))
			mixed = protowire.AppendTag(mixed, fd.Number(), typ)
			mixed = append(mixed, v...)
		}
		out["mixed"] = mixed
	case fd.IsList():
		// Each element its own record, in two messages appended.
		l := rm.Get(fd).List()
		a, z := new(prefixdv1.Query), new(prefixdv1.Query)
		for i := range l.Len() {
			dst := a
			if i%2 == 1 {
				dst = z
			}
			dst.ProtoReflect().Mutable(fd).List().Append(l.Get(i))
		}
		ab, err1 := proto.Marshal(a)
		zb, err2 := proto.Marshal(z)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		out["interleaved"] = append(ab, zb...)
	default:
		// Given twice: the last wins.
		first := new(prefixdv1.Query)
		setRandom(first.ProtoReflect(), fd, rand.New(rand.NewPCG(7, 8)), 0)
		fb, err := proto.Marshal(first)
		if err != nil {
			t.Fatal(err)
		}
		out["twice"] = append(fb, b...)
	}
	return out
}

// fillRandom sets every field of m to a random value, nested messages too
// (up to a depth).
func fillRandom(m protoreflect.Message, rng *rand.Rand, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		if rng.IntN(4) > 0 {
			setRandom(m, fields.Get(i), rng, depth)
		}
	}
}

// setRandom sets fd of m to a random value of its kind: a non-zero scalar,
// a list of 1 to 8 elements, a filled message, or a map entry.
func setRandom(m protoreflect.Message, fd protoreflect.FieldDescriptor, rng *rand.Rand, depth int) {
	switch {
	case fd.IsMap():
		mp := m.Mutable(fd).Map()
		for range 1 + rng.IntN(3) {
			k := scalarValue(fd.MapKey(), rng)
			if fd.MapValue().Message() != nil {
				v := mp.NewValue()
				fillRandom(v.Message(), rng, depth+1)
				mp.Set(k.MapKey(), v)
			} else {
				mp.Set(k.MapKey(), scalarValue(fd.MapValue(), rng))
			}
		}
	case fd.IsList():
		l := m.Mutable(fd).List()
		for range 1 + rng.IntN(8) {
			if fd.Message() != nil {
				if depth < 3 {
					fillRandom(l.AppendMutable().Message(), rng, depth+1)
				}
				continue
			}
			l.Append(scalarValue(fd, rng))
		}
	case fd.Message() != nil:
		if depth < 3 {
			fillRandom(m.Mutable(fd).Message(), rng, depth+1)
		}
	default:
		m.Set(fd, scalarValue(fd, rng))
	}
}

// scalarValue returns a random non-zero value of fd's scalar kind.
func scalarValue(fd protoreflect.FieldDescriptor, rng *rand.Rand) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vs := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vs.Get(vs.Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(rng.Uint32()) | 1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(rng.Uint32() | 1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(rng.Uint64()) | 1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(rng.Uint64() | 1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(rng.Float32() + 1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(rng.Float64() + 1)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-é-%d", fd.Name(), rng.IntN(1000)))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(rng.Uint32()) | 1, 0xff})
	}
	panic(fmt.Sprintf("no random value of kind %s", fd.Kind()))
}

func isScalar(k protoreflect.Kind) bool {
	return k != protoreflect.StringKind && k != protoreflect.BytesKind && k != protoreflect.MessageKind && k != protoreflect.GroupKind
}

// appendScalar appends the unpacked wire value of v, of kind k, to b and
// returns its wire type.
func appendScalar(b []byte, k protoreflect.Kind, v protoreflect.Value) (protowire.Type, []byte) {
	switch k {
	case protoreflect.BoolKind:
		return protowire.VarintType, protowire.AppendVarint(b, protowire.EncodeBool(v.Bool()))
	case protoreflect.EnumKind:
		return protowire.VarintType, protowire.AppendVarint(b, uint64(v.Enum()))
	case protoreflect.Int32Kind, protoreflect.Int64Kind:
		return protowire.VarintType, protowire.AppendVarint(b, uint64(v.Int()))
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind:
		return protowire.VarintType, protowire.AppendVarint(b, v.Uint())
	case protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		return protowire.VarintType, protowire.AppendVarint(b, protowire.EncodeZigZag(v.Int()))
	case protoreflect.Fixed32Kind:
		return protowire.Fixed32Type, protowire.AppendFixed32(b, uint32(v.Uint()))
	case protoreflect.Sfixed32Kind:
		return protowire.Fixed32Type, protowire.AppendFixed32(b, uint32(v.Int()))
	case protoreflect.FloatKind:
		return protowire.Fixed32Type, protowire.AppendFixed32(b, math.Float32bits(float32(v.Float())))
	case protoreflect.Fixed64Kind:
		return protowire.Fixed64Type, protowire.AppendFixed64(b, v.Uint())
	case protoreflect.Sfixed64Kind:
		return protowire.Fixed64Type, protowire.AppendFixed64(b, uint64(v.Int()))
	case protoreflect.DoubleKind:
		return protowire.Fixed64Type, protowire.AppendFixed64(b, math.Float64bits(v.Float()))
	}
	panic(fmt.Sprintf("kind %s is not a packable scalar", k))
}
