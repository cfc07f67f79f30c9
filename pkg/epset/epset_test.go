package epset

import (
	"reflect"
	"testing"
)

func TestSetOperations(t *testing.T) {
	tests := []struct {
		name string
		got  Set
		want []int
	}{
		{"empty", Set{}, []int{}},
		{"of", Of(0, 63, 64, 255, 256, -1), []int{0, 63, 64, 255}},
		{"firstN 0", FirstN(0), []int{}},
		{"firstN 3", FirstN(3), []int{0, 1, 2}},
		{"firstN 65 len", Of(FirstN(65).Slice()[64]), []int{64}},
		{"and", Of(1, 2, 3).And(Of(2, 3, 4)), []int{2, 3}},
		{"or", Of(1).Or(Of(200)), []int{1, 200}},
		{"andnot", Of(1, 2, 130).AndNot(Of(2)), []int{1, 130}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.got.Slice(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	if FirstN(300).Len() != Max {
		t.Fatalf("FirstN must clamp at Max")
	}
	s := Of(5, 70)
	s.Remove(5)
	if s.Has(5) || !s.Has(70) || s.Min() != 70 || s.Next(71) != -1 || s.String() != "{70}" {
		t.Fatalf("unexpected set state %v", s)
	}
	if !(Set{}).Empty() || (Set{}).Min() != -1 {
		t.Fatalf("empty set misbehaves")
	}
}
