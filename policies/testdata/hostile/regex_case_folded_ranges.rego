# attacks: regex.match of (?i) and 1,024 classes [B-\x{1E942}]: Go's parser folds each rune of a case-insensitive class range one at a time, 125,000 a class (3 s to parse, as many again to compile, without a \p escape, and the classes merge small)
# expect: deny
package wb.admission

c0 := "[B-\\x{1E942}]"

c1 := concat("", [c0, c0, c0, c0, c0, c0, c0, c0, c0, c0, c0, c0, c0, c0, c0, c0])

c2 := concat("", [c1, c1, c1, c1, c1, c1, c1, c1, c1, c1, c1, c1, c1, c1, c1, c1])

pattern := concat("", ["(?i)", c2, c2, c2, c2])

deny contains "answered in time" if regex.match(pattern, "x")
