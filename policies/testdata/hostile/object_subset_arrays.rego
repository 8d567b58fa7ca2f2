# attacks: object.subset of two arrays of 30,000 and 60,000 ones: the naive subarray search compares 900 million pairs in one call
# expect: deny
package wb.admission

sub := array.concat([1 | some _ in numbers.range(1, 30000)], [2])

super := [1 | some _ in numbers.range(1, 60000)]

deny contains "answered in time" if not object.subset(super, sub)
