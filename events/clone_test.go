package events

import (
	"reflect"
	"testing"
)

// fill gives every slice reachable from v (a struct) one element, so that
// a field added later is filled too.
func fill(v reflect.Value) {
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Slice {
			continue
		}
		f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		if e := f.Index(0); e.Kind() == reflect.Struct {
			fill(e)
		} else {
			e.Set(reflect.ValueOf(1).Convert(e.Type()))
		}
	}
}

// aliases reports the first slice reachable from a and b (structs of one
// type) that shares its backing array, by field path.
func aliases(a, b reflect.Value, path string) string {
	for i := range a.NumField() {
		fa, fb := a.Field(i), b.Field(i)
		if fa.Kind() != reflect.Slice || fa.Len() == 0 {
			continue
		}
		name := path + "." + a.Type().Field(i).Name
		if fa.Pointer() == fb.Pointer() {
			return name
		}
		if fa.Index(0).Kind() == reflect.Struct {
			for j := range fa.Len() {
				if p := aliases(fa.Index(j), fb.Index(j), name); p != "" {
					return p
				}
			}
		}
	}
	return ""
}

// A clone shares no memory with its batch, whatever fields Batch and
// Event grow: a batch held while the next decode reuses the original's
// memory stays as it was.
func TestCloneSharesNothing(t *testing.T) {
	var b Batch
	fill(reflect.ValueOf(&b).Elem())
	c := b.Clone()
	if !reflect.DeepEqual(*c, b) {
		t.Fatalf("clone differs:\n%+v\n%+v", *c, b)
	}
	if p := aliases(reflect.ValueOf(b), reflect.ValueOf(*c), "Batch"); p != "" {
		t.Fatalf("%s shares memory with the original", p)
	}
}
