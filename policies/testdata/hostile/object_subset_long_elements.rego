# attacks: object.subset of arrays of 4,096 and 2,048 distinct but equal strings of 820 bytes: the subarray search compares 4 million pairs, each string to its end (0.5 s in one call)
# expect: deny
package wb.admission

s0 := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

s1 := concat("", [s0, s0, s0])

sub := array.concat([concat("", [s1, format_int(i % 1, 10)]) | some i in numbers.range(1, 2047)], ["b"])

super := [concat("", [s1, format_int(i % 1, 10)]) | some i in numbers.range(1, 4096)]

deny contains "answered in time" if not object.subset(super, sub)
