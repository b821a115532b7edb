<?xml version="1.0" encoding="UTF-8"?>
<!-- Shared by the MARC crosswalks: drop the ISBD punctuation that closes a value. -->
<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:template name="trim-isbd">
    <xsl:param name="value"/>
    <xsl:variable name="v" select="normalize-space($value)"/>
    <xsl:variable name="last" select="substring($v, string-length($v))"/>
    <xsl:choose>
      <xsl:when test="string-length($v) &gt; 0 and contains(' /:;,=.', $last)">
        <xsl:call-template name="trim-isbd">
          <xsl:with-param name="value" select="substring($v, 1, string-length($v) - 1)"/>
        </xsl:call-template>
      </xsl:when>
      <xsl:otherwise><xsl:value-of select="$v"/></xsl:otherwise>
    </xsl:choose>
  </xsl:template>
</xsl:stylesheet>
